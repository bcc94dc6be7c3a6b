"""Generate a continuation with a local Hugging Face checkpoint.

    python -m rrc_jax.generate --model=DIR --prompt=TEXT [--max_new_tokens=N --temperature=T --top_p=P
                               --top_k=K --seed=S --system=TEXT --dtype=bfloat16]

Only the continuation text goes to stdout; logs go to stderr. The prompt is rendered with the tokenizer's chat
template when it has one, else used as is (`rrc_jax.models.format_prompt`). Generation ends at a stop token: the
model's (`generation_config.json`'s `eos_token_id` when there is one, else `config.json`'s) or the tokenizer's EOS.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

_MODEL = flags.DEFINE_string("model", None, "Hugging Face model directory (config.json, safetensors, tokenizer).")
_PROMPT = flags.DEFINE_string("prompt", None, "User prompt text.")
_SYSTEM = flags.DEFINE_string("system", None, "Optional system prompt (chat templates only).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Most tokens to generate.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature; 0 = greedy.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass; 1 = off.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Top-k filter; 0 = off.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Parameter and compute dtype.")
_MESH = flags.DEFINE_string("mesh", "1,-1,1", "Device mesh DATA,FSDP,TENSOR (-1: the remaining devices); the model is "
                            "sharded over fsdp x tensor.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax

    from rrc_jax import distributed
    from rrc_jax.inference import SamplingParams, make_sampler
    from rrc_jax.models import load_hf, load_tokenizer, prompt_ids
    from rrc_jax.sharding import mesh_from_flag

    try:
        distributed.initialize()
        mesh = mesh_from_flag(_MESH.value)
        model = load_hf(_MODEL.value, dtype=_DTYPE.value, mesh=mesh)
        tokenizer = load_tokenizer(_MODEL.value)
    except (FileNotFoundError, ValueError) as e:  # ConfigError is a ValueError
        sys.exit(f"error: {e}")
    ids = prompt_ids(tokenizer, _PROMPT.value, _SYSTEM.value)
    logging.info("prompt: %d tokens; generating up to %d", len(ids), _MAX_NEW.value)
    try:
        params = SamplingParams(_TEMPERATURE.value, _TOP_K.value, _TOP_P.value, max_new_tokens=_MAX_NEW.value)
        with jax.set_mesh(mesh):
            out = make_sampler(model, tokenizer).generate([ids], 1, params, rng=_SEED.value)
    except ValueError as e:  # a sampling setting or a prompt too long for the model: the user's to change
        sys.exit(f"error: {e}")
    n = int(out.lengths[0])
    sys.stdout.write(tokenizer.decode(out.tokens[0, :n].tolist(), skip_special_tokens=True) + "\n")
    logging.info("generated %d tokens%s", n, " (truncated)" if out.truncated[0] else "")


if __name__ == "__main__":
    flags.mark_flags_as_required(["model", "prompt"])
    app.run(main)
