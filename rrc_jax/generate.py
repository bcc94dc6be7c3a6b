"""Generate a continuation with a local Hugging Face checkpoint.

    python -m rrc_jax.generate --model=DIR --prompt=TEXT [--max_new_tokens=N --temperature=T --top_p=P
                               --top_k=K --seed=S --system=TEXT --dtype=bfloat16]

Only the continuation text goes to stdout; logs go to stderr. The prompt is rendered with the tokenizer's chat
template when it has one, else used as is (`rrc_jax.models.format_prompt`). Generation ends at a stop token: the
model's (`generation_config.json`'s `eos_token_id` when there is one, else `config.json`'s) or the tokenizer's EOS.
"""

from __future__ import annotations

import sys

import jax
from absl import flags, logging

from rrc_jax import cli
from rrc_jax.inference import SamplingParams, make_sampler
from rrc_jax.models import prompt_ids

_MODEL = cli.model_flags()
_PROMPT = flags.DEFINE_string("prompt", None, "User prompt text.")
_SYSTEM = flags.DEFINE_string("system", None, "Optional system prompt (chat templates only).")
_SAMPLING = cli.sampling_flags(max_new_tokens=128, temperature=0.0)


def generate() -> None:
    """Load the checkpoint, generate, print the continuation (a user's mistake raises `ConfigError`)."""
    model, tokenizer, mesh = cli.load_model(_MODEL.model.value, _MODEL.dtype.value, _MODEL.mesh.value)
    ids = prompt_ids(tokenizer, _PROMPT.value, _SYSTEM.value)
    s = _SAMPLING
    logging.info("prompt: %d tokens; generating up to %d", len(ids), s.max_new_tokens.value)
    params = SamplingParams(s.temperature.value, s.top_k.value, s.top_p.value, max_new_tokens=s.max_new_tokens.value)
    with jax.set_mesh(mesh):
        out = make_sampler("policy", model, tokenizer).generate([ids], 1, params, rng=s.seed.value)
    n = int(out.lengths[0])
    sys.stdout.write(tokenizer.decode(out.tokens[0, :n].tolist(), skip_special_tokens=True) + "\n")
    logging.info("generated %d tokens%s", n, " (truncated)" if out.truncated[0] else "")


def main(argv: list[str]) -> None:
    cli.no_arguments(argv)
    # a sampling setting or a prompt too long for the model (ValueError) is the user's to change
    cli.exit_on_user_error(generate, also=(ValueError,))


if __name__ == "__main__":
    flags.mark_flag_as_required("prompt")
    cli.start(main)
