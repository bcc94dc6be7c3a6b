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

import jax
from absl import flags, logging

from rrc_jax import cli
from rrc_jax.errors import ConfigError
from rrc_jax.judge import JudgeConfig, get_template
from rrc_jax.judge.templates import question_length
from rrc_jax.progress import say
from rrc_jax.rm.accuracy import abstention_causes, fitted_judge

_MODEL = cli.model_flags("the judge")
_PROMPT = flags.DEFINE_string("prompt", None, "The user prompt both responses answer.")
_A = flags.DEFINE_string("a", None, "Response a.")
_B = flags.DEFINE_string("b", None, "Response b.")
_VOTES = flags.DEFINE_integer("votes", 1, "Judgments of the pair (V).")
_SWAP = flags.DEFINE_boolean("swap", True, "Show every second vote with A and B swapped (position-bias debiasing).")
_TEMPLATE = flags.DEFINE_string("template", "rrc_pairwise_cot", "Judge template: a name (rrc_jax.judge.TEMPLATES) or "
                                "a .json / .yaml file.")
_SAMPLING = cli.sampling_flags(max_new_tokens=512, temperature=1.0, what=" per judgment (reasoning + verdict)")


def judge_pair() -> None:
    """Load the judge, ask it `--votes` times, print every vote and the tally (a user's mistake raises
    `ConfigError`)."""
    if _VOTES.value < 1:
        raise ConfigError(f"--votes={_VOTES.value}: the pair needs at least one judgment; give --votes=1 or more")
    template = get_template(_TEMPLATE.value)
    model, tokenizer, mesh = cli.load_model(_MODEL.model.value, _MODEL.dtype.value, _MODEL.mesh.value)
    lengths = [question_length(tokenizer, template, _PROMPT.value, a=a, b=b)
               for a, b in ((_A.value, _B.value), (_B.value, _A.value))]
    s = _SAMPLING
    asking = JudgeConfig(template=template, max_new_tokens=s.max_new_tokens.value, temperature=s.temperature.value,
                         top_p=s.top_p.value, top_k=s.top_k.value, seed=s.seed.value)
    judge = fitted_judge(model, tokenizer, asking, lengths)
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


def main(argv: list[str]) -> None:
    cli.no_arguments(argv)
    cli.exit_on_user_error(judge_pair, also=(ValueError,))  # a sampling setting, a question too long: the user's


if __name__ == "__main__":
    flags.mark_flags_as_required(["prompt", "a", "b"])
    cli.start(main)
