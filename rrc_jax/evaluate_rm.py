"""Evaluate a reward model (a generative judge or a discriminative reward model) on a preference dataset.

    python -m rrc_jax.evaluate_rm --model=DIR --data=FILE --format=helpsteer3|rmbench|judgebench|pairs
        [--kind=pairwise|pointwise|drm --votes=V --template=NAME --max_new_tokens=N --temperature=T --top_p=P
         --top_k=K --seed=S --prc --nothink --split=NAME --skip_bad_rows --min_strength=S --limit=N --chunk=N
         --max_batch=N --out=result.json --dump=verdicts.jsonl --mesh=auto --dtype=float32]

`--model` is a local Hugging Face checkpoint with its tokenizer: the judge (`--kind=pairwise`, default, or
`pointwise`) or the DRM (`--kind=drm`: a checkpoint with a value head, `score.weight`). The data is read with
`rrc_jax.data.preferences.load_preferences` (its counts go to stderr; `--limit` counts rows of the file, so
RM-Bench rows stay whole). The Markdown table of the metrics goes to stdout; progress and logs go to stderr; a
mistake of the user's (missing file, bad flag, unknown template, a malformed row) ends with one line `error: ...`.

How the examples are asked:

- pairwise: each example is judged `--votes` times with the chosen response shown as A and `--votes` times with it
  shown as B (2V questions; `--template`, default `rrc_pairwise_cot`). With `--prc`, P(A) is also read at the
  verdict position in both orders (after the judge's reasoning; `--nothink`: with the direct-verdict template).
- pointwise: chosen and rejected are each scored `--votes` times (`--template`, default `irpo_pointwise`).
- drm: the value head scores chosen and rejected once (`--max_batch` rows per model call).

The judgment budget fits the judge's context: when no question fits it with `--max_new_tokens` (every one would
abstain unasked), the budget is lowered to what fits the longest question, said in one line; when even that leaves
no room it is an error naming `--max_new_tokens`. A result that measures nothing (every vote abstained, or no DRM
score finite) is an error saying why, not a score (`--dump` is still written).

Judge calls take `--chunk` examples at a time (a progress bar counts them); each call is batched by the sampler in
`--max_batch` rows. Greedy decoding (`--temperature=0`, the default) gives V identical votes: use V > 1 only with
a temperature > 0.

Metrics (see `rrc_jax.rm.accuracy` for the exact rules):

- accuracy: share of examples where chosen beats rejected (votes over both orders; mean pointwise score; DRM
  score); a tie counts 0.5.
- judgebench_accuracy (pairwise): JudgeBench's official rule: each order's majority votes +1 / -1 / 0 and an example
  is correct only when the sum is positive (a split between the two orders counts as wrong).
- rmbench/hard, rmbench/normal, rmbench/easy, rmbench/overall (when every example has an RM-Bench style): the
  3x3 chosen-style x rejected-style accuracy matrix per row; hard = upper triangle (the rejected response is more
  styled), normal = diagonal, easy = lower triangle; averaged over rows.
- accuracy_by_domain/NAME: accuracy per domain of the data.
- position_consistency (pairwise): among examples decided in both orders, the share whose orders agree.
- abstain_rate: votes without a parseable verdict (or score) over all votes.
- judge_tokens_per_pair: judge tokens generated per example; truncated_rate: judgments cut at --max_new_tokens.
- prc/low, prc/high, prc/saturated, prc/accuracy (with --prc): the shares of P(chosen) in [0, 0.1] and [0.9, 1]
  and their sum (RRC Table 6), and the accuracy of P(chosen) > 0.5.

`--out` writes the result as JSON (NaN as null, with the arguments under `args`); `--dump` writes one JSON line
per example: prompt, chosen, rejected, key, domain, style, the votes of each order, every judgment (the order shown,
the judge's text, its verdict, the winner), `correct`, and for the DRM the two scores, so a failure can be read.
On several hosts every host evaluates the whole data set (process 0 writes the files).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import jax
from absl import flags

from rrc_jax import cli, distributed
from rrc_jax.data.preferences import FORMATS, load_preferences
from rrc_jax.errors import ConfigError
from rrc_jax.judge import JudgeConfig, get_template
from rrc_jax.judge.templates import question_length
from rrc_jax.progress import Progress, say
from rrc_jax.rm.accuracy import (
    KINDS,
    abstention_causes,
    evaluate,
    fitted_judge,
    markdown_table,
    nothing_scored,
    question_items,
)
from rrc_jax.rm.scores import DRMScorer

DEFAULT_TEMPLATES = {"pairwise": "rrc_pairwise_cot", "pointwise": "irpo_pointwise"}


@dataclasses.dataclass(frozen=True)
class Args:
    """The command line's settings (one field per flag; see the module docstring)."""

    model: str
    data: str
    format: str
    kind: str = "pairwise"
    votes: int = 1
    template: str = ""             # "" = DEFAULT_TEMPLATES[kind]
    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    prc: bool = False
    think: bool = True
    split: str = ""                # "" = the loader's default
    skip_bad_rows: bool = False
    min_strength: int = 0
    limit: int = 0                 # rows; 0 = all
    chunk: int = 64
    max_batch: int = 256
    out: str = ""
    dump: str = ""
    mesh: str = "auto"
    dtype: str = "float32"

    def judge_config(self) -> JudgeConfig:
        """How the judge is asked: `--template` (default `DEFAULT_TEMPLATES[kind]`, resolved to its `JudgeTemplate`),
        `--max_new_tokens` and the sampling flags."""
        return JudgeConfig(template=get_template(self.template or DEFAULT_TEMPLATES[self.kind]),
                           max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                           top_k=self.top_k, seed=self.seed)


def _jsonable(x):
    """NaN -> None (strict JSON), recursively."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def run(args: Args) -> tuple[dict, list[dict]]:
    """The command line's work: load, evaluate, print the table, write `--out` / `--dump`. Returns
    `(result, records)` (`rrc_jax.rm.accuracy.evaluate`). User mistakes raise `ConfigError`, `FileNotFoundError`
    or `ValueError`."""
    if args.kind not in KINDS:
        raise ConfigError(f"--kind={args.kind!r}; use one of {', '.join(KINDS)}")
    if args.votes < 1:
        raise ConfigError(f"--votes={args.votes} must be >= 1")
    if args.prc and args.kind != "pairwise":
        raise ConfigError(f"--prc reads a pairwise judge's verdict; it does not apply to --kind={args.kind}")
    if args.limit < 0:
        raise ConfigError(f"--limit={args.limit} must be >= 0 (0 = all)")
    if args.votes > 1 and args.temperature == 0 and args.kind != "drm":
        say(f"warning: --votes={args.votes} with --temperature=0 repeats one greedy judgment; set a temperature > 0")

    distributed.initialize()
    loader = {"split": args.split} if args.split else {}
    data = load_preferences(args.data, args.format, skip_bad_rows=args.skip_bad_rows, min_strength=args.min_strength,
                            limit=args.limit or None, **loader)
    counts = ", ".join(f"{k} {v}" for k, v in data.counts.items())
    say(f"data: {data.source}: {len(data.prefs)} examples" + (f" ({counts})" if counts else ""))
    if not data.prefs:
        raise ConfigError(f"--data={args.data}: no examples to evaluate ({counts or 'empty'})")

    model, tokenizer, mesh = cli.load_model(args.model, args.dtype, args.mesh)
    judge = drm = None
    n = len(data.prefs)
    if args.kind == "drm":
        drm = DRMScorer(model, tokenizer, args.max_batch)
        say(f"scoring {n} pairs with the DRM: {2 * n} responses")
    else:
        asking = args.judge_config()
        template = asking.template
        lengths = [question_length(tokenizer, template, prompt, **item)
                   for prompt, item in question_items(args.kind, data.prefs)]
        judge = fitted_judge(model, tokenizer, asking, lengths, max_batch=args.max_batch)
        what = "orders x" if args.kind == "pairwise" else "responses x"
        say(f"judging {n} pairs: 2 {what} {args.votes} votes = {2 * n * args.votes} questions"
            + (f", then {2 * n} P(A) reads (--prc)" if args.prc else "")
            + f", {args.chunk or n} pairs per call (template {judge.template.name})")
    passes = 2 if args.prc else 1
    with jax.set_mesh(mesh), Progress(passes * n, f"evaluate_rm ({args.kind})") as bar:
        result, records = evaluate(args.kind, data.prefs, judge=judge, drm=drm, votes=args.votes, prc=args.prc,
                                   think=args.think, chunk=args.chunk, progress=bar.update)
    if judge is not None:
        say(f"judge: {judge.summary()}")
    if distributed.is_main() and args.dump:  # also when nothing was scored: the judgments say why
        with open(args.dump, "w") as f:
            for r in records:
                f.write(json.dumps(_jsonable(r), ensure_ascii=False) + "\n")
    why = nothing_scored(args.kind, result, records)
    if why and judge is None:
        raise ConfigError(f"{why}: no score to report; check the checkpoint (--model) and --dtype")
    if why:
        read = f"the judgments are in {args.dump}" if args.dump else "--dump=FILE writes the judgments"
        raise ConfigError(f"{why} ({abstention_causes(judge)}): no score to report; raise --max_new_tokens if "
                          f"judgments were cut, or use the template the judge was trained with (--template); {read}")
    if distributed.is_main():
        sys.stdout.write(markdown_table(result) + "\n")
        sys.stdout.flush()
        if args.out:
            with open(args.out, "w") as f:
                json.dump(_jsonable({**result, "args": dataclasses.asdict(args)}), f, indent=2)
                f.write("\n")
    return result, records


def _define_flags():
    d = Args
    cli.model_flags("the judge, or the DRM with --kind=drm", dtype=d.dtype, mesh=d.mesh)
    cli.sampling_flags(max_new_tokens=d.max_new_tokens, temperature=d.temperature, seed=d.seed,
                       what=" per judgment (reasoning + verdict)")
    flags.DEFINE_string("data", None, "The preference data file.")
    flags.DEFINE_enum("format", None, list(FORMATS), "The data's format (rrc_jax.data.preferences.load_preferences).")
    flags.DEFINE_enum("kind", d.kind, ["pairwise", "pointwise", "drm"], "The reward model: a pairwise judge, a "
                      "pointwise judge, or a discriminative reward model (value head).")
    flags.DEFINE_integer("votes", d.votes, "Judgments per order (pairwise) or scores per response (pointwise).")
    flags.DEFINE_string("template", d.template, "Judge template: a name (rrc_jax.judge.TEMPLATES) or a .json / .yaml "
                        "file; default rrc_pairwise_cot (pairwise), irpo_pointwise (pointwise).")
    flags.DEFINE_boolean("prc", d.prc, "Also read P(A) at the verdict position and report its buckets (pairwise).")
    flags.DEFINE_boolean("think", d.think, "--prc: read P(A) after the judge's reasoning; --nothink: with the "
                         "template's direct-verdict variant.")
    flags.DEFINE_string("split", d.split, "Data split for the loader (default: the loader's).")
    flags.DEFINE_boolean("skip_bad_rows", d.skip_bad_rows, "Skip (and count) malformed rows instead of stopping.")
    flags.DEFINE_integer("min_strength", d.min_strength, "Drop (and count) preferences weaker than this (HelpSteer3's "
                         "|overall_preference|; IRPO: 2); helpsteer3 and pairs only.")
    flags.DEFINE_integer("limit", d.limit, "Read at most this many rows of the data (an RM-Bench row makes 9 examples; "
                         "0 = all).")
    flags.DEFINE_integer("chunk", d.chunk, "Examples per judge / DRM call (0 = all in one call).")
    flags.DEFINE_integer("max_batch", d.max_batch, "Most rows per model call.")
    flags.DEFINE_string("out", d.out, "Write the result as JSON to this file.")
    flags.DEFINE_string("dump", d.dump, "Write one JSON line per example (texts, judgments, verdicts) to this file.")
    flags.mark_flags_as_required(["data", "format"])


def main(argv: list[str]) -> None:
    cli.no_arguments(argv)
    args = Args(**{f.name: flags.FLAGS[f.name].value for f in dataclasses.fields(Args)})
    cli.exit_on_user_error(run, args, also=(ValueError,))  # flags, data, checkpoint, template: the user's to fix


if __name__ == "__main__":
    _define_flags()
    cli.start(main)
