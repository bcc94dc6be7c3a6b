"""Judge one pair with a local Hugging Face checkpoint and show every vote.

    python -m rrc_jax.judge --model=DIR --prompt=TEXT --a=TEXT --b=TEXT [--votes=V --template=NAME
                            --max_new_tokens=N --temperature=T --top_p=P --top_k=K --seed=S --noswap
                            --dtype=bfloat16]

Prints each vote's reasoning and verdict (with A/B swapping, every second vote shows the pair reversed; the winner
is reported in the caller's terms, `a` or `b`) and the tally. Logs and errors go to stderr. When the question does
not fit the judge's context with `--max_new_tokens`, the budget is lowered to what fits (said in one line); when
every vote abstains, a `warning:` line says why (the tally counts the abstentions; it is not a score).
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

_MODEL = flags.DEFINE_string("model", None, "Hugging Face model directory (config.json, safetensors, tokenizer).")
_PROMPT = flags.DEFINE_string("prompt", None, "The user prompt both responses answer.")
_A = flags.DEFINE_string("a", None, "Response a.")
_B = flags.DEFINE_string("b", None, "Response b.")
_VOTES = flags.DEFINE_integer("votes", 1, "Judgments of the pair (V).")
_SWAP = flags.DEFINE_boolean("swap", True, "Show every second vote with A and B swapped (position-bias debiasing).")
_TEMPLATE = flags.DEFINE_string("template", "rrc_pairwise_cot", "Judge template: a name (rrc_jax.judge.TEMPLATES) or "
                                "a .json / .yaml file.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512, "Most tokens per judgment (reasoning + verdict).")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature; 0 = greedy.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass; 1 = off.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Top-k filter; 0 = off.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Parameter and compute dtype.")
_MESH = flags.DEFINE_string("mesh", "1,-1,1", "Device mesh DATA,FSDP,TENSOR (-1: the remaining devices); the model is "
                            "sharded over fsdp x tensor.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _VOTES.value < 1:
        sys.exit(f"error: --votes={_VOTES.value}: the pair needs at least one judgment; give --votes=1 or more")
    import jax

    from rrc_jax import distributed
    from rrc_jax.errors import ConfigError
    from rrc_jax.judge import get_template
    from rrc_jax.judge.templates import question_length
    from rrc_jax.models import load_hf, load_tokenizer
    from rrc_jax.progress import say
    from rrc_jax.rm.evaluation import abstention_causes, fitted_judge
    from rrc_jax.sharding import mesh_from_flag

    try:
        distributed.initialize()
        mesh = mesh_from_flag(_MESH.value)
        template = get_template(_TEMPLATE.value)
        model, tokenizer = load_hf(_MODEL.value, dtype=_DTYPE.value, mesh=mesh), load_tokenizer(_MODEL.value)
        lengths = [question_length(tokenizer, template, _PROMPT.value, a=a, b=b)
                   for a, b in ((_A.value, _B.value), (_B.value, _A.value))]
        judge = fitted_judge(model, tokenizer, template, lengths, _MAX_NEW.value, temperature=_TEMPERATURE.value,
                             top_p=_TOP_P.value, top_k=_TOP_K.value, seed=_SEED.value)
    except (ConfigError, FileNotFoundError, ValueError) as e:  # flags, template, checkpoint: the user's to fix
        sys.exit(f"error: {e}")
    with jax.set_mesh(mesh):
        votes, log = judge.explain([_PROMPT.value], [_A.value], [_B.value], votes=_VOTES.value, swap=_SWAP.value)
    for v in log:
        shown = "A = b, B = a (swapped)" if v.swapped else "A = a, B = b"
        print(f"=== vote {v.vote + 1}/{_VOTES.value} ({shown}) ===")
        print(v.text)
        print(f"--- verdict: {v.verdict or 'none (abstain)'}" + (f" -> {v.winner} wins" if v.winner else ""))
    print(f"tally: a {int(votes.wins[0])}, b {int(votes.losses[0])}, abstain {int(votes.abstains[0])}")
    logging.info("judge metrics: %s", judge.summary())
    if votes.abstains[0] == _VOTES.value:  # the tally counts them; say why
        say(f"warning: all {_VOTES.value} votes abstained ({abstention_causes(judge)}); raise --max_new_tokens or "
            "use the template the judge was trained with (--template)")


if __name__ == "__main__":
    flags.mark_flags_as_required(["model", "prompt", "a", "b"])
    app.run(main)
