"""The real model as its own judge: on the packaged chat prompts (`rrc_jax.data.chat`), SmolLM2-135M-Instruct
(`rrc_jax.models.real_model`) samples two responses a prompt and judges the pair in both orders, greedily, in the
judge template and budget of `configs/real.py`.

    python benchmarks/real_judge.py [--prompts=96 --temperature=1.0 --response_tokens=64 --max_batch=64 --seed=0]

What it reports, each without and with `reward.judge.force_verdicts` (module docstring of `rrc_jax.judge.judge`):

- abstentions: votes with no verdict. One greedy run gives both columns: the judgments are the same texts either
  way, and forcing only reads a verdict where a judgment wrote none (`Judge._forced`), so a vote abstains without
  forcing exactly when its text has no verdict (`parse_verdict`).
- "A" share: of the votes with a verdict, the share that named the response shown first (position bias).
- position consistency: of the pairs whose two votes (one per order) both have a verdict, the share where both
  name the same response.
- agreement with a length-free rule: the response holding the prompt's answer (`rrc_jax.data.chat.
  contains_answer`: normalized, case-insensitive, as a whole token) beats the one that does not. Only the decisive
  pairs count (one response holds it); pairs where both or neither hold it are counted and left out. Per vote:
  the share of decided votes on decisive pairs that name the holder; per pair: both votes name it (agree), both
  name the other (disagree), one each (split), or a vote without a verdict (abstained).

Prints a markdown table and writes the figures, and every pair's responses, judgments and verdicts, to
benchmarks/results/real_judge.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from absl import flags

from rrc_jax import cli

MODES = ("without", "with")  # force_verdicts off / on


def define_flags() -> None:
    """The benchmark's flags (module docstring)."""
    flags.DEFINE_integer("prompts", 96, "Chat prompts used (the first N of the packaged set's 96).")
    flags.DEFINE_float("temperature", 1.0, "The policy's sampling temperature.")
    flags.DEFINE_integer("response_tokens", 64, "Most tokens of a sampled response.")
    flags.DEFINE_integer("max_batch", 64, "Most rows per model call.")
    flags.DEFINE_integer("seed", 0, "The responses' sampling seed.")
    flags.DEFINE_string("out", str(Path(__file__).parent / "results" / "real_judge.json"), "JSON path.")


def vote_winners(votes, forced: bool) -> np.ndarray:
    """The winner of each of 2K votes `[K, 2]` object ('a' | 'b' | None; the caller's order, vote 0 and vote 1 of
    pair k in its two A/B orders) from the judge's log (`Judge.explain`, forced verdicts on): as read with forcing,
    or, without, only where the judgment's own text has a verdict."""
    from rrc_jax.judge.verdicts import parse_verdict

    winners = np.full((len(votes) // 2, 2), None, object)
    for v in votes:
        winners[v.pair, v.vote] = v.winner if forced or parse_verdict(v.text) is not None else None
    return winners


def first_shown(votes) -> np.ndarray:
    """`[K, 2]` object: the verdict as shown ('A' | 'B' | None) of each vote, forced verdicts included."""
    shown = np.full((len(votes) // 2, 2), None, object)
    for v in votes:
        shown[v.pair, v.vote] = v.verdict
    return shown


def judge_figures(winners: np.ndarray, shown: np.ndarray, holds: np.ndarray) -> dict:
    """The report's figures (module docstring) of one mode, a rate of nothing None. `winners [K, 2]` ('a' | 'b' |
    None per vote, the caller's order), `shown [K, 2]` (the verdict as shown, read where `winners` has one),
    `holds [K, 2]` bool (response a / b holds the prompt's answer)."""
    decided = winners != None  # noqa: E711 - elementwise on an object array
    both = decided.all(axis=1)
    consistent = both & (winners[:, 0] == winners[:, 1])
    decisive = holds[:, 0] != holds[:, 1]
    holder = np.where(holds[:, 0], "a", "b")
    right = decided & (winners == holder[:, None])
    on_decisive = decided & decisive[:, None]
    n_votes, n_decided = winners.size, int(decided.sum())
    return dict(
        votes=n_votes, abstentions=n_votes - n_decided, abstention_rate=(n_votes - n_decided) / n_votes,
        a_share=float((shown[decided] == "A").mean()) if n_decided else None,
        consistency_pairs=int(both.sum()), consistent_pairs=int(consistent.sum()),
        position_consistency=float(consistent.sum() / both.sum()) if both.any() else None,
        decisive_pairs=int(decisive.sum()), both_hold_pairs=int((holds.all(axis=1)).sum()),
        neither_holds_pairs=int((~holds.any(axis=1)).sum()),
        decisive_votes=int(on_decisive.sum()), agreeing_votes=int((right & decisive[:, None]).sum()),
        vote_agreement=float(right[on_decisive].mean()) if on_decisive.any() else None,
        pairs_agree=int((decisive & both & right.all(axis=1)).sum()),
        pairs_disagree=int((decisive & both & ~right.any(axis=1)).sum()),
        pairs_split=int((decisive & both & (right.sum(axis=1) == 1)).sum()),
        pairs_abstained=int((decisive & ~both).sum()))


def share(part: int, whole: int) -> str:
    """`part/whole (x%)`, or `0/0` when there is no whole."""
    return f"{part}/{whole} ({part / whole:.1%})" if whole else f"{part}/{whole}"


def markdown_table(figures: dict[str, dict]) -> str:
    """The figures of both modes (`judge_figures`, by mode) as a markdown table."""
    head = ("| force_verdicts | abstentions | \"A\" share | position consistency | agreement (votes) | "
            "decisive pairs: agree / split / disagree / abstained |")
    lines = [head, "| --- | --- | --- | --- | --- | --- |"]
    for mode, f in figures.items():
        lines.append(
            f"| {mode} | {share(f['abstentions'], f['votes'])} | "
            f"{'-' if f['a_share'] is None else format(f['a_share'], '.1%')} | "
            f"{share(f['consistent_pairs'], f['consistency_pairs'])} | "
            f"{share(f['agreeing_votes'], f['decisive_votes'])} | "
            f"{f['pairs_agree']} / {f['pairs_split']} / {f['pairs_disagree']} / {f['pairs_abstained']} |")
    return "\n".join(lines)


def run() -> None:
    """Sample the pairs, judge them in both orders, print the table and write the JSON (module docstring)."""
    args = flags.FLAGS
    cli.check_at_least(1, "prompts", "response_tokens", "max_batch")
    if not args.temperature >= 0:
        raise cli.flag_error("temperature", "must be >= 0")

    from rrc_jax.configs.real import get_config
    from rrc_jax.data.chat import chat_rows, contains_answer
    from rrc_jax.inference import SamplingParams, make_sampler
    from rrc_jax.inference.sampler import response_texts
    from rrc_jax.judge import Judge
    from rrc_jax.models import load_hf, load_tokenizer, prompt_ids
    from rrc_jax.models.real_model import real_model_dir

    recipe = get_config().reward.judge
    rows = chat_rows()[:args.prompts]
    t0 = time.perf_counter()
    path = real_model_dir()
    tok, model = load_tokenizer(path), load_hf(path)
    prompts = [r["prompt"] for r in rows]

    t1 = time.perf_counter()
    policy = make_sampler("policy", model, tok, max_batch=args.max_batch)
    out = policy.generate([prompt_ids(tok, p) for p in prompts], 2,
                          SamplingParams(args.temperature, max_new_tokens=args.response_tokens), rng=args.seed)
    texts = response_texts(tok, out)
    a, b = texts[0::2], texts[1::2]
    holds = np.array([[contains_answer(x, r["answer"]) for x in (ra, rb)] for r, ra, rb in zip(rows, a, b)], bool)

    t2 = time.perf_counter()
    judge = Judge(make_sampler("grm", model, tok, max_batch=args.max_batch), tok, template=recipe.template,
                  temperature=0.0, max_new_tokens=recipe.max_new_tokens, force_verdicts=True)
    _, votes = judge.explain(prompts, a, b, votes=2, swap=True)  # vote 0 and vote 1 of a pair: its two orders
    t3 = time.perf_counter()

    shown = first_shown(votes)
    figures = {}
    for mode in MODES:
        figures[mode] = judge_figures(vote_winners(votes, forced=mode == "with"), shown, holds)
    summary = judge.summary()
    seconds = dict(load=t1 - t0, sample=t2 - t1, judge=t3 - t2, total=t3 - t0)
    print(f"real judge: {path.name}, {len(rows)} chat prompts x 2 responses (temperature {args.temperature}, "
          f"<= {args.response_tokens} tokens); judge {recipe.template!r}, greedy, {recipe.max_new_tokens} tokens, "
          f"each pair in both orders; responses holding the answer: {holds.mean():.1%}")
    print(markdown_table(figures))
    f = figures["with"]
    print(f"decisive pairs (one response holds the answer): {f['decisive_pairs']} of {len(rows)}; left out: both hold "
          f"it {f['both_hold_pairs']}, neither {f['neither_holds_pairs']}")
    print(f"judge: {summary['questions']} questions, {summary['forced_verdicts']} forced, {summary['truncated']} cut "
          f"off at max_new_tokens, {summary['reuse_fallbacks']} sent whole (no prefix reuse); seconds: "
          + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    pairs = [dict(id=r["id"], answer=r["answer"], responses=[ra, rb], holds=h.tolist(),
                  judgments=[v.text for v in votes if v.pair == k],
                  verdicts_shown=[v.verdict for v in votes if v.pair == k],
                  swapped=[v.swapped for v in votes if v.pair == k])
             for k, (r, ra, rb, h) in enumerate(zip(rows, a, b, holds))]
    result = dict(model=path.name, prompts=len(rows), temperature=args.temperature,
                  response_tokens=args.response_tokens, seed=args.seed, template=recipe.template,
                  judge_tokens=recipe.max_new_tokens, responses_holding_answer=float(holds.mean()),
                  figures=figures, judge=summary, seconds=seconds, pairs=pairs)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    define_flags()
    cli.start(cli.flags_main(run))
