"""Evaluating a reward model on preference data: a pairwise judge, a pointwise judge or a discriminative reward model.

Shapes: N examples (`Preference`s), V votes per order, 2 orders.

Every kind first turns the examples into per-example *records* (plain dicts, one JSON line each in a dump), then the
metrics are small functions of the arrays read from them:

- pairwise (`judge_pairs`): each example is judged V times with the chosen response shown as A (order 1) and V
  times with it shown as B (order 2), all in one judge call. `vote_counts(records)` is `[N, 2, 3]` int: per order
  the votes for chosen, for rejected, and the abstentions.
- pointwise (`score_pointwise`): each response is scored V times (`Judge.score`, NaN when unparseable).
- DRM (`score_pairs`): the value head's score of chosen and of rejected (`rrc_jax.rm.scores.DRMScorer`).

Metrics (`evaluate` computes the ones that apply; all are shares in [0, 1]):

- accuracy: mean over examples of 1 when chosen beats rejected, 0.5 on a tie, 0 otherwise. Pairwise: chosen's votes
  over both orders against rejected's (`pair_correct`); pointwise: the mean of its scores (NaN ignored; no score
  left on either side is a tie); DRM: its score (`score_correct`).
- judgebench_accuracy (pairwise, JudgeBench's official rule): each order's majority decides +1 (chosen), -1
  (rejected) or 0 (tie, or only abstentions); an example is correct iff the two orders' sum is > 0, so a split
  (one order each way) is *not* correct, where `accuracy` gives it 0.5.
- rmbench (every example has a `style`): per RM-Bench row (`key`) the 3x3 matrix M[i, j] = correctness of chosen
  style i against rejected style j (0 concise, 1 detailed, 2 detailed markdown); hard = mean of the upper triangle
  (i < j: the rejected response has more style), normal = the diagonal, easy = the lower triangle; each averaged
  over rows, and overall = the mean of all 9 cells.
- accuracy_by_domain: accuracy per `Preference.domain` (when the data has domains).
- position_consistency (pairwise): among the examples where both orders' majorities are decided, the share where
  they name the same winner. A judge that always answers "A" has 0.
- abstain_rate: abstained votes (unparseable or truncated judgments; pointwise: NaN scores) over all votes.
- judge_tokens_per_pair: tokens the judge generated per example (all 2V judgments; pointwise 2V scores), and
  truncated_rate: judgments cut off at `max_new_tokens` over all judgments.
- prc (pairwise, asked for): P(chosen) read at the verdict position (`Judge.preference_prob`) in both orders
  (chosen as A: P(A); chosen as B: 1 - P(A)); `low` / `high` are the shares of those 2N probabilities in [0, 0.1] and
  [0.9, 1] and `saturated` their sum (RRC Table 6, `prc_buckets`); `accuracy` = mean over examples of the two
  orders' mean P(chosen) > 0.5 (0.5 on equality).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from rrc_jax.data.preferences import Preference
from rrc_jax.errors import ConfigError
from rrc_jax.inference import make_sampler
from rrc_jax.judge import Judge, JudgeConfig, get_template
from rrc_jax.judge.judge import sampler_context_length
from rrc_jax.progress import say

KINDS = ("pairwise", "pointwise", "drm")
ORDERS = ("chosen as A", "chosen as B")  # order 1, order 2
STYLES = ("concise", "detailed", "detailed markdown")


# ------------------------------------------------------------------------------------------------------------
# Records
# ------------------------------------------------------------------------------------------------------------

def _base(p: Preference) -> dict:
    return {"key": p.key, "domain": p.domain, "style": list(p.style) if p.style is not None else None,
            "prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}


def judge_pairs(judge: Judge, prefs: Sequence[Preference], votes: int = 1) -> list[dict]:
    """Ask the pairwise judge about N examples, `votes` times in each order, in one call (2NV questions).

    Returns N records: the example's fields, `order1` / `order2` (chosen shown as A / as B), each
    `{"chosen": int, "rejected": int, "abstain": int}` votes, and `judgments`: per question its `order` (1 or 2),
    `shown` ("A = chosen, B = rejected" or the reverse), the judge's `text`, its `verdict` as shown ('A' | 'B' | None)
    and the `winner` ("chosen" | "rejected" | None)."""
    # swap=True with 2V votes: vote v of example k is shown reversed iff v + k is odd, so V in each order
    pv, log = judge.explain([p.prompt for p in prefs], [p.chosen for p in prefs], [p.rejected for p in prefs],
                            votes=2 * votes, swap=True)
    records = []
    for p in prefs:
        r = _base(p)
        r["order1"], r["order2"] = ({"chosen": 0, "rejected": 0, "abstain": 0} for _ in range(2))
        r["judgments"] = []
        records.append(r)
    for v in log:
        order = 2 if v.swapped else 1
        winner = {"a": "chosen", "b": "rejected", None: None}[v.winner]
        r = records[v.pair]
        r[f"order{order}"][winner or "abstain"] += 1
        r["judgments"].append({"order": order, "shown": "A = rejected, B = chosen" if v.swapped else
                               "A = chosen, B = rejected", "text": v.text, "verdict": v.verdict, "winner": winner})
    for r in records:
        r["judgments"].sort(key=lambda j: j["order"])  # stable: order 1's votes, then order 2's
    return records


def vote_counts(records: Sequence[dict]) -> np.ndarray:
    """`[N, 2, 3]` int32 from `judge_pairs` records: `[n, order, (chosen, rejected, abstain)]`."""
    return np.array([[[r[o]["chosen"], r[o]["rejected"], r[o]["abstain"]] for o in ("order1", "order2")]
                     for r in records], np.int32).reshape(len(records), 2, 3)


def score_pointwise(judge: Judge, prefs: Sequence[Preference], votes: int = 1) -> list[dict]:
    """Score chosen and rejected `votes` times each with the judge's pointwise template, in one call (2NV questions).

    Returns N records: the example's fields and `scores_chosen`, `scores_rejected` `[V]` (None where the judge
    abstained)."""
    scores = judge.score([p.prompt for p in prefs], [[p.chosen] * votes + [p.rejected] * votes for p in prefs],
                         template=judge.template)  # [N, 2V]
    records = []
    for p, s in zip(prefs, scores):
        r = _base(p)
        r["scores_chosen"], r["scores_rejected"] = ([None if math.isnan(x) else float(x) for x in s[i * votes:
                                                    (i + 1) * votes]] for i in range(2))
        records.append(r)
    return records


def score_pairs(drm, prefs: Sequence[Preference]) -> list[dict]:
    """Score chosen and rejected with a discriminative reward model (`rrc_jax.rm.scores.DRMScorer`, or anything
    with its `scores(prompts, responses) -> [K]`) in one call. Returns N records: the example's fields and
    `score_chosen`, `score_rejected`."""
    n = len(prefs)
    s = np.asarray(drm.scores([p.prompt for p in prefs] * 2, [p.chosen for p in prefs] + [p.rejected for p in prefs]))
    records = []
    for k, p in enumerate(prefs):
        r = _base(p)
        r["score_chosen"], r["score_rejected"] = float(s[k]), float(s[n + k])
        records.append(r)
    return records


def prc_probs(judge: Judge, prefs: Sequence[Preference], think: bool = True) -> np.ndarray:
    """P(chosen) `[N, 2]` float32 read at the verdict position (`Judge.preference_prob`): column 0 with chosen shown
    as A (P(A)), column 1 with chosen shown as B (1 - P(A)); one call of 2N questions."""
    n = len(prefs)
    prompts = [p.prompt for p in prefs]
    chosen, rejected = [p.chosen for p in prefs], [p.rejected for p in prefs]
    p_a = judge.preference_prob(prompts * 2, chosen + rejected, rejected + chosen, think=think)
    return np.stack([p_a[:n], 1.0 - p_a[n:]], axis=1).astype(np.float32)


# ------------------------------------------------------------------------------------------------------------
# Metrics
# ------------------------------------------------------------------------------------------------------------

def _mean(x) -> float:
    x = np.asarray(x, np.float64)
    return float(x.mean()) if x.size else math.nan


def order_decisions(votes: np.ndarray) -> np.ndarray:
    """Each order's majority `[N, 2]` int: +1 chosen, -1 rejected, 0 tie or only abstentions (votes `[N, 2, 3]`)."""
    return np.sign(votes[..., 0].astype(np.int64) - votes[..., 1])


def pair_correct(votes: np.ndarray) -> np.ndarray:
    """`[N]` float: 1 when chosen's votes over both orders exceed rejected's, 0.5 on a tie, else 0."""
    total = votes.sum(axis=1)  # [N, 3]
    return np.where(total[:, 0] > total[:, 1], 1.0, np.where(total[:, 0] == total[:, 1], 0.5, 0.0))


def pair_accuracy(votes: np.ndarray) -> float:
    """Mean of `pair_correct` (votes `[N, 2, 3]`)."""
    return _mean(pair_correct(votes))


def judgebench_correct(votes: np.ndarray) -> np.ndarray:
    """`[N]` bool, JudgeBench's rule: the two orders' majorities (`order_decisions`) sum to more than 0."""
    return order_decisions(votes).sum(axis=1) > 0


def judgebench_accuracy(votes: np.ndarray) -> float:
    """Mean of `judgebench_correct` (votes `[N, 2, 3]`): a split between the orders is not correct."""
    return _mean(judgebench_correct(votes))


def position_consistency(votes: np.ndarray) -> float:
    """Among the examples whose both orders are decided, the share whose orders agree on the winner (NaN if none)."""
    d = order_decisions(votes)
    decided = (d != 0).all(axis=1)
    return _mean(d[decided, 0] == d[decided, 1])


def abstain_rate(votes: np.ndarray) -> float:
    """Abstained votes over all votes (votes `[N, 2, 3]`; NaN with no votes)."""
    total = int(votes.sum())
    return int(votes[..., 2].sum()) / total if total else math.nan


def score_correct(s_chosen, s_rejected) -> np.ndarray:
    """`[N]` float from scores `[N]`: 1 where chosen's is higher, 0.5 where equal or either is NaN, else 0."""
    c, r = np.asarray(s_chosen, np.float64), np.asarray(s_rejected, np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(c) | np.isnan(r) | (c == r), 0.5, np.where(c > r, 1.0, 0.0))


def prc_buckets(p_chosen) -> dict[str, float]:
    """RRC Table 6: the shares of the probabilities `p_chosen` (any shape) in [0, 0.1] (`low`) and [0.9, 1]
    (`high`), and `saturated` = low + high."""
    p = np.asarray(p_chosen, np.float64).ravel()
    low, high = _mean(p <= 0.1), _mean(p >= 0.9)
    return {"low": low, "high": high, "saturated": low + high}


def rmbench_accuracy(correct, keys: Sequence[str], styles: Sequence[tuple[int, int]]) -> dict[str, float]:
    """RM-Bench's hard / normal / easy accuracy from per-example correctness `correct [N]`, the RM-Bench row of each
    example (`keys [N]`) and its (chosen style, rejected style) (`styles [N]`).

    Per row, M[i, j] `[3, 3]` = correctness of chosen style i vs rejected style j; hard = mean of M[i < j], normal =
    mean of the diagonal, easy = mean of M[i > j]; each averaged over rows; overall = the mean of all cells. A row
    without exactly one example per cell is a ValueError."""
    cells: dict[str, np.ndarray] = {}
    seen: dict[str, np.ndarray] = {}
    for c, key, style in zip(correct, keys, styles):
        i, j = (int(s) for s in style)
        if not (0 <= i < 3 and 0 <= j < 3):
            raise ValueError(f"RM-Bench row {key!r}: style {tuple(style)} is not a pair of 0..2 "
                             f"({', '.join(STYLES)})")
        m = cells.setdefault(key, np.zeros((3, 3)))
        n = seen.setdefault(key, np.zeros((3, 3), np.int64))
        m[i, j] = c
        n[i, j] += 1
    for key, n in seen.items():
        if (n != 1).any():
            missing = [f"({i}, {j})" for i, j in zip(*np.nonzero(n == 0))]
            repeated = [f"({i}, {j})" for i, j in zip(*np.nonzero(n > 1))]
            raise ValueError(f"RM-Bench row {key!r} needs each of the 9 (chosen style, rejected style) pairs once; "
                             + (f"missing {', '.join(missing)}" if missing else "")
                             + ("; " if missing and repeated else "")
                             + (f"repeated {', '.join(repeated)}" if repeated else "")
                             + ". Evaluate whole RM-Bench rows (load_preferences(..., 'rmbench') makes the 9 pairs "
                             "of each row, with the row's key)")
    if not cells:
        return {"hard": math.nan, "normal": math.nan, "easy": math.nan, "overall": math.nan}
    m = np.stack(list(cells.values()))  # [rows, 3, 3]
    upper, lower = np.triu_indices(3, 1), np.tril_indices(3, -1)
    return {"hard": float(m[:, upper[0], upper[1]].mean()), "normal": float(np.diagonal(m, axis1=1, axis2=2).mean()),
            "easy": float(m[:, lower[0], lower[1]].mean()), "overall": float(m.mean())}


def domain_accuracy(correct, domains: Sequence[str]) -> dict[str, float]:
    """Mean correctness per domain, domains in sorted order."""
    groups: dict[str, list[float]] = defaultdict(list)
    for c, d in zip(correct, domains):
        groups[d].append(float(c))
    return {d: _mean(groups[d]) for d in sorted(groups)}


# ------------------------------------------------------------------------------------------------------------
# What fits the judge's context, and a result that measures nothing
# ------------------------------------------------------------------------------------------------------------

def question_items(kind: str, prefs: Sequence[Preference]) -> list[tuple[str, dict[str, str]]]:
    """`(prompt, item)` of each question `evaluate` asks a judge of `kind` about `prefs`: both A/B orders of each
    pair (pairwise), each response (pointwise)."""
    if kind == "pairwise":
        return [(p.prompt, {"a": a, "b": b}) for p in prefs for a, b in ((p.chosen, p.rejected),
                                                                         (p.rejected, p.chosen))]
    return [(p.prompt, {"response": r}) for p in prefs for r in (p.chosen, p.rejected)]


def fit_judgment_budget(max_new_tokens: int, context: int | None, lengths: Sequence[int],
                        flag: str = "--max_new_tokens", template: str | None = None) -> tuple[int, str | None]:
    """(the judgment budget to judge with, a line saying why it differs from `max_new_tokens`, else None).

    `max_new_tokens` while some question of `lengths` tokens fits the judge's `context` with it; when none does
    (each would abstain unasked), what fits the longest question. A `ConfigError` naming `flag` when even that
    leaves no room (naming the `template` the questions are written in, part of every one). `context` None
    (unknown): unchanged."""
    if context is None or not lengths or min(lengths) + max_new_tokens <= context:
        return max_new_tokens, None
    longest, shortest = max(lengths), min(lengths)
    room = context - longest
    if room < 1:
        lower = (f"lower {flag} to at most {context - shortest} (longer questions are then skipped, as "
                 "abstentions), " if context - shortest >= 1 else "")
        raise ConfigError(f"{flag}={max_new_tokens}: no question fits the judge's {context}-token context with a "
                          f"judgment that long, and the longest ({longest} tokens) leaves no room for one; {lower}"
                          + (f"use a shorter template than {template} (--template; the toy judge's: "
                             "toy_pairwise_cot), " if template else "")
                          + "give shorter examples or use a judge with a longer context")
    return room, (f"judge: no question fits the judge's {context}-token context with {flag}={max_new_tokens}; "
                  f"judging with {flag}={room} (the longest question takes {longest} tokens)")


def fitted_judge(model, tokenizer, config: JudgeConfig, lengths: Sequence[int], *, max_batch: int = 256) -> Judge:
    """A `Judge` on `model` asking as `config` says, its judgment budget (`config.max_new_tokens`) lowered to what
    fits the model's context for questions of `lengths` tokens (`fit_judgment_budget`, its note said)."""
    sampler = make_sampler("grm", model, tokenizer, max_batch=max_batch)
    budget, note = fit_judgment_budget(config.max_new_tokens, sampler_context_length(sampler), lengths,
                                       template=get_template(config.template).name)
    if note:
        say(note)
    return Judge(sampler, tokenizer, dataclasses.replace(config, max_new_tokens=budget))


def abstention_causes(judge: Judge, flag: str = "--max_new_tokens") -> str:
    """Why `judge`'s questions abstained, from its metrics: how many did not fit its context, how many were cut at
    its judgment budget (the setting `flag`), how many had no parseable verdict or score."""
    m, budget = judge.metrics, judge.config.max_new_tokens
    other = max(0, m.abstains - m.too_long - m.truncated)
    return (f"{m.too_long} did not fit the judge's {judge.context_length}-token context with {flag}={budget}, "
            f"{m.truncated} were cut at {flag}={budget}, {other} had no parseable verdict or score")


def nothing_scored(kind: str, result: dict, records: Sequence[dict]) -> str | None:
    """Why `evaluate`'s `(result, records)` measure nothing, None when something was scored: every judge vote
    abstained (pairwise, pointwise), or no DRM score is finite."""
    if kind == "drm":
        finite = [math.isfinite(r[k]) for r in records for k in ("score_chosen", "score_rejected")]
        return None if any(finite) else f"every one of the DRM's {len(finite)} scores is NaN or infinite"
    rate = result.get("abstain_rate", math.nan)
    return None if rate < 1 else f"all {2 * result['examples'] * result['votes']} judge votes abstained"


# ------------------------------------------------------------------------------------------------------------
# The evaluation
# ------------------------------------------------------------------------------------------------------------

def _chunks(n: int, chunk: int | None) -> list[slice]:
    step = chunk if chunk and chunk > 0 else max(n, 1)
    return [slice(s, min(s + step, n)) for s in range(0, n, step)]


def evaluate(kind: str, prefs: Sequence[Preference], *, judge: Judge | None = None, drm=None, votes: int = 1,
             prc: bool = False, think: bool = True, chunk: int | None = None,
             progress: Callable[[int], None] | None = None) -> tuple[dict, list[dict]]:
    """Evaluate a reward model on N preference examples (see the module docstring for each metric).

    Args:
      kind: "pairwise" (`judge` with a pairwise template), "pointwise" (`judge` with a pointwise template) or "drm"
        (`drm`: a `DRMScorer`).
      votes: V judgments per order (pairwise) or scores per response (pointwise).
      prc: pairwise only: also read P(chosen) at the verdict position (another 2N questions; with `think` the judge
        writes its reasoning first, else the direct-verdict template is read).
      chunk: examples per judge / DRM call (None: all in one); `progress(n)` is called after each chunk with the
        examples it held (with `prc`, the P(A) reads are a second pass over the chunks).

    Returns `(result, records)`: the metrics (`examples`, `accuracy`, ...) and one record per example, each with its
    `correct` (and for pairwise `judgebench_correct`, with `prc` `p_chosen [2]`).
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; use one of {', '.join(KINDS)}")
    if kind == "drm" and drm is None:
        raise ValueError("kind='drm' needs drm= (a DRMScorer over a reward model with a value head)")
    if kind != "drm" and judge is None:
        raise ValueError(f"kind={kind!r} needs judge= (a Judge)")
    if prc and kind != "pairwise":
        raise ValueError(f"prc=True reads a pairwise judge's verdict; it does not apply to kind={kind!r}")
    if votes < 1:
        raise ValueError(f"votes={votes} must be >= 1")
    if not prefs:
        raise ValueError("no examples to evaluate")
    prefs = list(prefs)
    n = len(prefs)

    def run(fn) -> list[dict]:
        out = []
        for s in _chunks(n, chunk):
            out += fn(prefs[s])
            if progress is not None:
                progress(s.stop - s.start)
        return out

    result: dict = {"kind": kind, "examples": n}
    if kind == "drm":
        records = run(lambda ps: score_pairs(drm, ps))
        correct = score_correct([r["score_chosen"] for r in records], [r["score_rejected"] for r in records])
    else:
        result["votes"] = votes
        tokens0, questions0, truncated0 = (judge.metrics.judge_tokens, judge.metrics.questions,
                                           judge.metrics.truncated)
        if kind == "pairwise":
            records = run(lambda ps: judge_pairs(judge, ps, votes))
            counts = vote_counts(records)
            correct = pair_correct(counts)
            for r, ok in zip(records, judgebench_correct(counts)):
                r["judgebench_correct"] = bool(ok)
        else:
            records = run(lambda ps: score_pointwise(judge, ps, votes))
            nan = lambda xs: np.array([math.nan if x is None else x for x in xs], np.float64)
            sc = np.stack([nan(r["scores_chosen"]) for r in records])    # [N, V]
            sr = np.stack([nan(r["scores_rejected"]) for r in records])  # [N, V]
            with warnings.catch_warnings():  # an all-NaN row's mean is NaN (a tie), without numpy's warning
                warnings.simplefilter("ignore", RuntimeWarning)
                correct = score_correct(np.nanmean(sc, axis=1), np.nanmean(sr, axis=1))
    for r, ok in zip(records, correct):
        r["correct"] = float(ok)
    result["accuracy"] = _mean(correct)
    if kind == "pairwise":
        result["judgebench_accuracy"] = judgebench_accuracy(counts)
    if all(p.style is not None for p in prefs):
        result["rmbench"] = rmbench_accuracy(correct, [p.key for p in prefs], [p.style for p in prefs])
    if any(p.domain for p in prefs):
        result["accuracy_by_domain"] = domain_accuracy(correct, [p.domain for p in prefs])
    if kind != "drm":
        if kind == "pairwise":
            result["position_consistency"] = position_consistency(counts)
            result["abstain_rate"] = abstain_rate(counts)
        else:
            result["abstain_rate"] = float(np.isnan(np.concatenate([sc, sr], axis=1)).mean())
        questions = judge.metrics.questions - questions0
        result["judge_tokens_per_pair"] = (judge.metrics.judge_tokens - tokens0) / n
        result["truncated_rate"] = (judge.metrics.truncated - truncated0) / questions if questions else math.nan
    if prc:
        p = []
        for s in _chunks(n, chunk):
            p.append(prc_probs(judge, prefs[s], think))
            if progress is not None:
                progress(s.stop - s.start)
        p = np.concatenate(p)  # [N, 2]
        for r, pc in zip(records, p):
            r["p_chosen"] = [float(x) for x in pc]
        result["prc"] = {**prc_buckets(p), "accuracy": _mean(score_correct(p.mean(axis=1), np.full(n, 0.5)))}
    return result, records


def _flat(result: dict, prefix: str = "") -> list[tuple[str, object]]:
    rows = []
    for k, v in result.items():
        if isinstance(v, dict):
            rows += _flat(v, f"{prefix}{k}/")
        else:
            rows.append((prefix + k, v))
    return rows


def markdown_table(result: dict) -> str:
    """The result as a two-column Markdown table, one metric per row (nested groups as `group/name`)."""
    lines = ["| metric | value |", "| --- | --- |"]
    for name, v in _flat(result):
        if isinstance(v, float):
            v = "n/a" if math.isnan(v) else f"{v:.4f}"
        lines.append(f"| {name} | {v} |")
    return "\n".join(lines)
