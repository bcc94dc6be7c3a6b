"""The study's report: per construction, statistics over seeds (mean and 95% confidence interval), the orderings the
intervals support, and the plots.

Per run (from its summary, `rrc_jax.study.runs.summarize`):
- `final`: held-out oracle quality at the last evaluation; `peak`: its largest value; `peak_step`: where;
- `fell`: the final quality is below the peak by more than twice the final evaluation's standard error;
- `hacked`: reward hacking, the reward rose (its mean over the second half of the steps above the first half's)
  while the quality fell. Only for a reward on one scale across steps (`absolute_reward`: DRM, AGR with fixed
  anchors, ...); a within-group reward (SCR's win counts) has a mean that cannot rise, so there it is undefined;
- `length_gain`: the rollouts' mean length over the last quarter of the steps minus the first quarter's (the toy
  judge's exploitable bias credits padding, `toy.length_bias`);
- `kendall_tau`, `advantage_error`: reward fidelity (`rrc_jax.rl.fidelity`), averaged over the run's steps;
  `kendall_tau_late`: over its last quarter;
- `prc_saturation`: the share of P(A) in [0, 0.1] or [0.9, 1] (PRC runs; Table 6), averaged over steps;
- `questions`, `judge_tokens` (generated), `reward_seconds`: judge cost per step;
- `tolerance_stops`: the adaptive schedules' share of groups or responses stopped by their tolerance, a step.

Per construction, each number's mean over seeds and the half-width of its 95% interval, `t(0.975, n - 1) x sd /
sqrt(n)` (Student's t: seeds are few). `orderings` lists, for final quality, peak quality and Kendall tau, the
pairs whose intervals do not overlap; any other pair cannot be told apart at this number of seeds.

The cost-fidelity frontier (`frontier`): for Kendall tau, final and peak quality, the constructions that no other
construction beats on the mean while generating no more judge tokens per step (a construction without a judge costs
0): the Pareto-optimal ones, named on the means; the intervals say which of their differences are real. Fewer
questions (`half_cost_lines`): the constructions asking at most half the round robin's questions, and whether their
Kendall tau lies in the round robin's interval.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from rrc_jax.config import parse
from rrc_jax.configs.study import get_config
from rrc_jax.constructions import CONSTRUCTIONS
from rrc_jax.study.runs import RUNS, StudyConfig, absolute_reward, run_fields, run_settings

# Student's t quantile t(0.975, df) for df = 1..30 (beyond: 1.96 is within 4%).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
METRICS = ("final", "peak", "peak_step", "fell", "hacked", "length_gain", "kendall_tau", "kendall_tau_late",
           "advantage_error", "prc_saturation", "questions", "judge_tokens", "reward_seconds", "steps_per_minute",
           "staleness", "tolerance_stops")
# the asynchronous step's runs beside their synchronous construction (`RUNS`: `<name>_stale<k>`)
STALE = re.compile(r"(.+)_stale(\d+)$")
# the metrics whose supported orderings the report states, with their names in it
ORDERED = {"final": "final quality", "peak": "peak quality", "kendall_tau": "Kendall tau"}
FRONTIER = ("kendall_tau", "final", "peak")  # each against judge tokens per step
ROUND_ROBIN = "scr"  # the construction the cheaper ones are measured against (`half_cost_lines`)
# the trainer fields outside the reward that the study's constructions vary: runs compared for fidelity share them
LEARNER_FIELDS = tuple(sorted({k for _, given in RUNS.values() for k in given if not k.startswith("reward.")}))


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


def interval(values) -> tuple[float, float, int]:
    """(mean, 95% half-width, n) of the finite `values`; half-width NaN with fewer than two."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
    if not x.size:
        return math.nan, math.nan, 0
    if x.size == 1:
        return float(x[0]), math.nan, 1
    return float(x.mean()), float(t975(x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)), int(x.size)


def _steps(series: dict) -> tuple[np.ndarray, np.ndarray]:
    steps = np.array(sorted(int(s) for s in series), np.int64)
    return steps, np.array([series[str(s)] for s in steps], np.float64)


def _mean_series(summary: dict, key: str, part: slice = slice(None)) -> float:
    """The mean of a per-step series over `part` of its steps (all by default); NaN when it was not logged."""
    s = summary["series"].get(key)
    if not s:
        return math.nan
    values = _steps(s)[1][part]
    return float(values.mean()) if values.size else math.nan


def _quarter(summary: dict, last: bool) -> slice:
    n = max(1, summary["steps"] // 4)
    return slice(-n, None) if last else slice(0, n)


def run_metrics(summary: dict) -> dict[str, float]:
    """One run's numbers (module docstring)."""
    out = {k: math.nan for k in METRICS}
    ev = summary["series"].get("eval/oracle_quality")
    if ev:
        steps, q = _steps(ev)
        out["final"], out["peak"], out["peak_step"] = float(q[-1]), float(q.max()), float(steps[q.argmax()])
        se = summary["series"].get("eval/oracle_quality_se", {}).get(str(steps[-1]), 0.0)
        out["fell"] = float(q[-1] < q.max() - 2 * se)
        reward = summary["series"].get("reward/mean")
        if reward and len(reward) >= 2 and summary.get("absolute_reward"):
            _, r = _steps(reward)
            half = len(r) // 2
            out["hacked"] = float(r[half:].mean() > r[:half].mean() and out["fell"])
    out["length_gain"] = (_mean_series(summary, "response_length", _quarter(summary, True))
                          - _mean_series(summary, "response_length", _quarter(summary, False)))
    out["kendall_tau"] = _mean_series(summary, "fidelity/kendall_tau")
    out["kendall_tau_late"] = _mean_series(summary, "fidelity/kendall_tau", _quarter(summary, True))
    out["advantage_error"] = _mean_series(summary, "fidelity/advantage_error")
    out["prc_saturation"] = _mean_series(summary, "reward/prc_saturation")
    out["questions"] = _mean_series(summary, "judge/questions")
    out["judge_tokens"] = _mean_series(summary, "judge/tokens")
    out["reward_seconds"] = _mean_series(summary, "time/reward")
    # a step's seconds: logged by the asynchronous step, else its phases' sum (the synchronous step's phases)
    step = (_mean_series(summary, "time/step") if "time/step" in summary["series"] else
            sum(_mean_series(summary, k) for k in ("time/rollout", "time/reward", "time/update")))
    out["steps_per_minute"] = 60.0 / step if step > 0 else math.nan
    out["staleness"] = _mean_series(summary, "staleness/mean") if "staleness/mean" in summary["series"] else 0.0
    out["tolerance_stops"] = _mean_series(summary, "judge/tolerance_stops")
    return out


def aggregate(summaries: list[dict]) -> dict:
    """Per construction (in the order first seen): seeds, every metric's mean / half-width, the mean eval curve
    with its interval by step, the mean PRC histogram; plus the supported final-quality orderings."""
    by: dict[str, list[dict]] = {}
    for s in summaries:
        by.setdefault(s["construction"], []).append(s)
    out: dict = {"constructions": {}}
    for name, runs in by.items():
        per_run = [run_metrics(s) for s in runs]
        entry = {"seeds": sorted(s["seed"] for s in runs), "kind": runs[0]["kind"], "votes": runs[0]["votes"],
                 "absolute_reward": runs[0].get("absolute_reward"), "learner": learner_fields(runs[0])}
        for k in METRICS:
            mean, half, n = interval([m[k] for m in per_run])
            entry[k] = {"mean": mean, "ci95": half, "n": n}
        steps = sorted({int(t) for s in runs for t in s["series"].get("eval/oracle_quality", {})})
        entry["curve"] = {str(t): dict(zip(("mean", "ci95", "n"), interval(
            [s["series"]["eval/oracle_quality"].get(str(t)) for s in runs
             if "eval/oracle_quality" in s["series"]]))) for t in steps}
        bins = [[_mean_series(s, f"prc/p_bin{k}") for k in range(10)] for s in runs if "prc/p_bin0" in s["series"]]
        if bins:
            entry["prc_histogram"] = np.nanmean(np.asarray(bins), axis=0).tolist()
        out["constructions"][name] = entry
    prc = out["constructions"].get("prc", {})
    for entry in out["constructions"].values():
        for key, cost in (("judge_tokens", "cost_vs_prc"), ("reward_seconds", "seconds_vs_prc")):
            base = prc.get(key, {}).get("mean", math.nan)
            entry[cost] = entry[key]["mean"] / base if base and math.isfinite(base) else math.nan
    out["orderings"] = {k: supported_orderings(out["constructions"], k) for k in ORDERED}
    out["frontier"] = {k: frontier(out["constructions"], k) for k in FRONTIER}
    return out


def learner_fields(summary: dict) -> dict | None:
    """The run's fields outside its reward that the study's constructions vary (`LEARNER_FIELDS`: the loss, the
    advantage, the staleness), from its summary's `config`, or for a summary written before summaries kept it, from
    its construction's trainer config (None for a construction this version does not know)."""
    if "config" in summary:
        config = summary["config"]
    elif summary["construction"] in RUNS:
        study = parse(StudyConfig, get_config())
        config = run_fields(run_settings(study, summary["construction"], summary["seed"]))
    else:
        return None
    return {k: config.get(k) for k in LEARNER_FIELDS}


def judge_cost(entry: dict) -> float:
    """Generated judge tokens per step (mean over seeds); 0 for a construction that asks no judge."""
    x = entry["judge_tokens"]["mean"]
    return x if math.isfinite(x) else 0.0


def frontier(entries: dict, key: str) -> list[str]:
    """The Pareto-optimal constructions of metric `key` against judge cost, cheapest first: those that no other
    construction beats on the mean of `key` at no more judge tokens per step (one that matches it at a lower
    cost, or beats it at the same cost, dominates it)."""
    points = {n: (judge_cost(e), e[key]["mean"]) for n, e in entries.items() if math.isfinite(e[key]["mean"])}
    optimal = [n for n, (c, v) in points.items()
               if not any(c2 <= c and v2 >= v and (c2 < c or v2 > v) for m, (c2, v2) in points.items() if m != n)]
    return sorted(optimal, key=lambda n: points[n][0])


def supported_orderings(entries: dict, key: str = "final") -> list[str]:
    """'A > B' for every pair whose 95% intervals of metric `key` do not overlap, larger first."""
    lo = {n: e[key]["mean"] - e[key]["ci95"] for n, e in entries.items()}
    hi = {n: e[key]["mean"] + e[key]["ci95"] for n, e in entries.items()}
    names = sorted(entries, key=lambda n: -entries[n][key]["mean"])
    return [f"{a} > {b}" for i, a in enumerate(names) for b in names[i + 1:]
            if math.isfinite(lo[a]) and math.isfinite(hi[b]) and lo[a] > hi[b]]


def _fmt(m: dict, digits: int = 3) -> str:
    if not math.isfinite(m["mean"]):
        return "n/a"
    return f"{m['mean']:.{digits}f}" + (f" ± {m['ci95']:.{digits}f}" if math.isfinite(m["ci95"]) else "")


def _runs(m: dict) -> str:
    """A 0/1 flag's count over seeds, `k / n`."""
    return f"{m['mean'] * m['n']:.0f} / {m['n']}" if m["n"] else "n/a"


def _ratio(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) else "n/a"


def grouped_orderings(orderings: list[str]) -> list[str]:
    """'A > B', 'A > C', 'B > C' as 'A > B, C' and 'B > C' (in the given order)."""
    above: dict[str, list[str]] = {}
    for pair in orderings:
        a, b = pair.split(" > ")
        above.setdefault(a, []).append(b)
    return [f"{a} > {', '.join(bs)}" for a, bs in above.items()]


def within(m: dict, base: dict) -> str:
    """Whether mean `m` lies in `base`'s 95% interval: "yes", "below", "above" or "n/a" (no interval)."""
    if not (math.isfinite(m["mean"]) and math.isfinite(base["mean"]) and math.isfinite(base["ci95"])):
        return "n/a"
    lo, hi = base["mean"] - base["ci95"], base["mean"] + base["ci95"]
    return "yes" if lo <= m["mean"] <= hi else "below" if m["mean"] < lo else "above"


def stale_lines(entries: dict) -> list[str]:
    """The asynchronous step's runs (`<name>_stale<k>`) beside their construction at k = 0, and whether each final
    quality lies in k = 0's interval."""
    matches = [(m, n) for n in entries if (m := STALE.match(n)) and m.group(1) in entries]
    rows = sorted((m.group(1), int(m.group(2)), n) for m, n in matches)
    if not rows:
        return []
    out = ["", "The asynchronous step (`rl.max_staleness = k`, docs/async.md): each step learns from rollouts sampled "
           "k updates earlier. Steps per minute are this machine's, the judge in the trainer's process on its one "
           "device beside the policy, while the study's other runs shared the cores.", "",
           "| construction | k | final quality | in k = 0's interval | peak quality | Kendall tau | mean staleness | "
           "steps / minute |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    outside = []
    for base in dict.fromkeys(b for b, _, _ in rows):
        for name, k in [(base, 0)] + [(n, k) for b, k, n in rows if b == base]:
            e = entries[name]
            inside = "" if k == 0 else within(e["final"], entries[base]["final"])
            if inside in ("below", "above"):
                outside.append(f"{base} at k = {k} ({_fmt(e['final'])}, {inside} {_fmt(entries[base]['final'])})")
            out.append(f"| {base} | {k} | {_fmt(e['final'])} | {inside} | {_fmt(e['peak'])} | "
                       f"{_fmt(e['kendall_tau'])} | {_fmt(e['staleness'], 2)} | {_fmt(e['steps_per_minute'], 2)} |")
    out += ["", "Final quality outside the k = 0 interval: " + "; ".join(outside) + "." if outside else
            "Every final quality at k >= 1 with an interval to compare lies in its construction's k = 0 interval."]
    return out


def half_cost_lines(entries: dict, base: str = ROUND_ROBIN) -> list[str]:
    """Fewer judge questions at what fidelity: every judged construction asking at most half the round robin's
    questions a step (`base`, SCR's) with the round robin's learner (`learner_fields`: a GSPO or asynchronous run
    ranks rollouts of another policy, so its tau is not comparable), cheapest first, with its share of them, its
    Kendall tau and whether that lies in the round robin's 95% interval, its final and peak quality; then, plainly,
    which reach the interval at <= 0.5x its questions, or that none does and by how much the closest falls short."""
    if base not in entries or not math.isfinite(entries[base]["questions"]["mean"]):
        return []
    full, tau = entries[base]["questions"]["mean"], entries[base]["kendall_tau"]
    cheap = sorted(((n, e) for n, e in entries.items() if 0 < e["questions"]["mean"] <= full / 2
                    and math.isfinite(e["kendall_tau"]["mean"]) and e.get("learner") == entries[base].get("learner")),
                   key=lambda ne: ne[1]["questions"]["mean"])
    if not cheap or not math.isfinite(tau["ci95"]):
        return []
    lo = tau["mean"] - tau["ci95"]
    out = ["", f"Fewer judge questions: the constructions asking at most half the round robin's ({base}: "
           f"{full:.0f} questions a step, Kendall tau {_fmt(tau)}) with its learner, cheapest first.", "",
           "| construction | questions / step | of the round robin's | Kendall tau | in its tau interval | "
           "final quality | peak quality |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, e in cheap:
        out.append(f"| {name} | {e['questions']['mean']:.0f} | {e['questions']['mean'] / full:.2f} | "
                   f"{_fmt(e['kendall_tau'])} | {within(e['kendall_tau'], tau)} | {_fmt(e['final'])} | "
                   f"{_fmt(e['peak'])} |")
    inside = [n for n, e in cheap if within(e["kendall_tau"], tau) in ("yes", "above")]
    if inside:
        out += ["", f"Within the round robin's tau interval at <= 0.5x its questions: {', '.join(inside)}."]
    else:
        name, e = max(cheap, key=lambda ne: ne[1]["kendall_tau"]["mean"])
        out += ["", f"None reaches the round robin's tau interval ({lo:.3f} to {tau['mean'] + tau['ci95']:.3f}) at "
                f"<= 0.5x its questions: the closest, {name} ({e['questions']['mean'] / full:.2f}x), has tau "
                f"{_fmt(e['kendall_tau'])}, {lo - e['kendall_tau']['mean']:.3f} below the interval's lower end."]
    return out


def study_overrides(summaries: list[dict]) -> list[tuple[dict | None, list[str]]]:
    """The trainer fields the study set for every run (a summary's `overrides`), each distinct set with the
    constructions whose runs had it, in the order they first appear (None: summaries written before they kept
    them)."""
    groups: dict[str, tuple[dict | None, list[str]]] = {}
    for summary in summaries:
        given = summary.get("overrides")
        names = groups.setdefault(json.dumps(given, sort_keys=True), (given, []))[1]
        if summary["construction"] not in names:
            names.append(summary["construction"])
    return list(groups.values())


def overrides_lines(groups: list) -> list[str]:
    """What the report says of `study_overrides`: nothing when no run had any (or its summary predates them), the
    fields when every run had the same, and each set with its constructions when they differ."""
    def fields(given):
        return "none" if not given else ", ".join(f"`{k}={v}`" for k, v in sorted(given.items()))

    if all(not given for given, _ in groups):
        return []
    if len(groups) == 1:
        return ["", f"Every run also sets {fields(groups[0][0])} (the study's `overrides`)."]
    return ["", "The runs differ in the study's `overrides`: " + "; ".join(
        f"{'not recorded' if given is None else fields(given)} ({', '.join(names)})" for given, names in groups) + "."]


def _steps_apart(result: dict) -> str:
    least = result.get("least_steps", result["steps"])
    return f"; some runs have only {least}" if least != result["steps"] else ""


def markdown(result: dict, plots: list[str]) -> str:
    """The report: the quality and fidelity table, the cost table, PRC saturation, the supported orderings, the
    judge audit when present, and the plots."""
    entries = result["constructions"]
    lines = ["# Reproduction study", "", f"Runs: {result['runs']} ({result['seeds_per_construction']} seeds per "
             f"construction, {result['steps']} steps{_steps_apart(result)}). Mean ± 95% interval over seeds. "
             "Definitions: `rrc_jax/study/report.py`.", *overrides_lines(result.get("overrides", [])), "",
             "| construction | final quality | peak quality | peak step | fell after peak | hacked | length gain | "
             "Kendall tau | tau, last quarter | advantage error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, e in entries.items():
        lines.append(
            f"| {name} | {_fmt(e['final'])} | {_fmt(e['peak'])} | {_fmt(e['peak_step'], 0)} | {_runs(e['fell'])} | "
            f"{_runs(e['hacked'])} | {_fmt(e['length_gain'], 2)} | {_fmt(e['kendall_tau'])} | "
            f"{_fmt(e['kendall_tau_late'])} | {_fmt(e['advantage_error'])} |")
    lines += ["", "`hacked` (reward up while quality fell) is n/a where the reward has no fixed scale across steps "
              "(within-group win counts, PRC against the current policy).", "",
              "| construction | questions / step | judge tokens / step | reward seconds / step | tokens vs PRC | "
              "seconds vs PRC |", "| --- | --- | --- | --- | --- | --- |"]
    for name, e in entries.items():
        lines.append(f"| {name} | {_fmt(e['questions'], 0)} | {_fmt(e['judge_tokens'], 0)} | "
                     f"{_fmt(e['reward_seconds'], 2)} | {_ratio(e['cost_vs_prc'])} | {_ratio(e['seconds_vs_prc'])} |")
    front = result["frontier"]
    lines += ["", "The cost-fidelity frontier: judge tokens per step against Kendall tau, final and peak quality "
              "(means over seeds; ✓: no construction scores higher at no more tokens).", "",
              "| construction | judge tokens / step | Kendall tau | final quality | peak quality | frontier: tau | "
              "final | peak |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, e in sorted(entries.items(), key=lambda ne: judge_cost(ne[1])):
        marks = " | ".join("✓" if name in front[k] else "" for k in FRONTIER)
        lines.append(f"| {name} | {judge_cost(e):.0f} | {_fmt(e['kendall_tau'])} | {_fmt(e['final'])} | "
                     f"{_fmt(e['peak'])} | {marks} |")
    lines += [""] + [f"- Pareto-optimal for {ORDERED[k]}: {', '.join(front[k]) or 'none'}." for k in FRONTIER]
    stopped = [f"{n} {_fmt(e['tolerance_stops'])}" for n, e in entries.items() if e["tolerance_stops"]["n"]]
    if stopped:
        lines += ["", "Tolerance stops (the adaptive schedules: the share of groups, for `active`, or of responses, "
                  "for `agr_sequential`, that their tolerance stopped before their budget, a step): "
                  + "; ".join(stopped) + "."]
    saturated = [f"{n} {_fmt(e['prc_saturation'])}" for n, e in entries.items() if e["prc_saturation"]["n"]]
    if saturated:
        lines += ["", "PRC saturation (share of P(A) in [0, 0.1] or [0.9, 1], Table 6): " + "; ".join(saturated) + "."]
    lines += half_cost_lines(entries)
    lines += stale_lines(entries)
    lines += ["", "Orderings the intervals support (the other pairs cannot be told apart):", ""]
    for key, pairs in result["orderings"].items():
        lines.append(f"- {ORDERED.get(key, key)}: " + ("; ".join(grouped_orderings(pairs)) if pairs else "none") + ".")
    if result.get("audit"):
        a = result["audit"]
        lines += ["", "The toy judge (`rrc_jax.data.toy.audit`): "
                  f"error rate {a['error_rate']:.3f} ({a['close_error_rate']:.3f} on close pairs), position "
                  f"inconsistency {a['position_inconsistency']:.3f}, intransitive triads "
                  f"{a['intransitive_triad_rate']:.3f}."]
    lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _families(entries: dict) -> dict[str, list[str]]:
    """Constructions by reward kind, the baselines (`Construction.baseline`: DRM, PRC) together: one panel each."""
    baselines = [k for k, c in CONSTRUCTIONS.items() if c.baseline]
    out: dict[str, list[str]] = {}
    for name, e in entries.items():
        title = (f"baselines ({', '.join(k.upper() for k in baselines)})" if e["kind"] in baselines
                 else e["kind"].upper())
        out.setdefault(title, []).append(name)
    return out


def plot(result: dict, out: Path) -> list[str]:
    """The PNGs (file names, in `out`): quality vs step with 95% bands (a panel per reward kind, PRC dashed in
    each for reference), reward fidelity, the cost-fidelity frontier, and the PRC probability histogram (when a PRC
    construction ran)."""
    import matplotlib  # heavy: only when plotting

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: only when plotting

    entries = result["constructions"]
    names = list(entries)
    color = {n: plt.cm.tab20(i % 20) for i, n in enumerate(names)}  # one colour per construction in every plot
    files = []

    def curve(name):
        c = entries[name]["curve"]
        steps = np.array(sorted(int(s) for s in c))
        return (steps, np.array([c[str(s)]["mean"] for s in steps]),
                np.nan_to_num(np.array([c[str(s)]["ci95"] for s in steps])))

    families = _families(entries)
    fig, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 4.5), sharey=True, squeeze=False)
    for ax, (title, members) in zip(axes[0], families.items()):
        if "prc" in entries and "prc" not in members:
            steps, mean, _ = curve("prc")
            ax.plot(steps, mean, "k--", lw=1, label="prc (reference)")
        for name in members:
            steps, mean, half = curve(name)
            ax.plot(steps, mean, marker="o", ms=3, label=name, color=color[name])
            ax.fill_between(steps, mean - half, mean + half, alpha=0.15, color=color[name])
        ax.set(xlabel="step", title=title)
        ax.legend(fontsize=7)
    axes[0][0].set(ylabel="held-out oracle quality")
    fig.suptitle("Held-out oracle quality (mean and 95% interval over seeds)")
    files.append(_save(fig, out / "quality_vs_step.png"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 0.3 * len(names) + 2))
    y = np.arange(len(names))
    for ax, keys, label in ((axes[0], ("kendall_tau", "kendall_tau_late"),
                             "Kendall tau, reward vs oracle within a group"),
                            (axes[1], ("advantage_error",), "advantage error (RMS vs oracle advantages)")):
        width = 0.8 / len(keys)
        for k, (key, tag) in enumerate(zip(keys, ("whole run", "last quarter"))):
            ax.barh(y + (k - (len(keys) - 1) / 2) * width, [entries[n][key]["mean"] for n in names], height=width,
                    xerr=np.nan_to_num([entries[n][key]["ci95"] for n in names]), alpha=0.75,
                    label=tag if len(keys) > 1 else None)
        ax.set(title=label, yticks=y, yticklabels=names)
        ax.invert_yaxis()
        if len(keys) > 1:
            ax.legend(fontsize=8)
    files.append(_save(fig, out / "fidelity.png"))

    fig, axes = plt.subplots(1, len(FRONTIER), figsize=(5.5 * len(FRONTIER), 4.8))
    floor = min([judge_cost(e) for e in entries.values() if judge_cost(e) > 0] or [1.0]) / 4  # cost 0, on a log axis
    for ax, key in zip(axes, FRONTIER):
        for name in names:
            e = entries[name]
            x = judge_cost(e) or floor
            ax.errorbar(x, e[key]["mean"], yerr=np.nan_to_num(e[key]["ci95"]), fmt="o", capsize=3, color=color[name],
                        mfc="white" if name not in result["frontier"][key] else color[name])
            ax.annotate(name + ("" if judge_cost(e) else " (no judge)"), (x, e[key]["mean"]), fontsize=7,
                        xytext=(4, 2), textcoords="offset points")
        front = result["frontier"][key]
        ax.step([judge_cost(entries[n]) or floor for n in front], [entries[n][key]["mean"] for n in front],
                where="post", color="k", lw=1, alpha=0.6, label="frontier (filled: on it)")
        ax.set(xscale="log", xlabel="generated judge tokens per step", ylabel=ORDERED[key], title=ORDERED[key])
        ax.legend(fontsize=7)
    fig.suptitle("Cost-fidelity frontier (mean and 95% interval over seeds)")
    files.append(_save(fig, out / "frontier.png"))

    hists = {n: e["prc_histogram"] for n, e in entries.items() if "prc_histogram" in e}
    if hists:
        fig, ax = plt.subplots(figsize=(7, 4))
        width = 0.8 / len(hists)
        for k, (name, h) in enumerate(hists.items()):
            ax.bar(np.arange(10) / 10 + 0.05 + (k - (len(hists) - 1) / 2) * width / 10, h, width=width / 10,
                   label=name, color=color[name])
        ax.set(xlabel="P(A)", ylabel="share of judgments", title="PRC probabilities (Table 6's buckets)")
        ax.legend()
        files.append(_save(fig, out / "prc_histogram.png"))
    return files


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt  # heavy: only when plotting

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def write_report(summary_paths: list[Path], out: Path, audit: dict | None = None) -> Path:
    """`out/study.json` (every construction's statistics, the audit), the plots and `out/report.md`."""
    summaries = [_with_scale(json.loads(Path(p).read_text())) for p in summary_paths]
    result = aggregate(summaries)
    per = {n: len(e["seeds"]) for n, e in result["constructions"].items()}
    result.update(runs=len(summaries), seeds_per_construction=min(per.values()) if per else 0,
                  steps=max((s["steps"] for s in summaries), default=0),
                  least_steps=min((s["steps"] for s in summaries), default=0),
                  overrides=study_overrides(summaries), audit=audit)
    out.mkdir(parents=True, exist_ok=True)
    plots = plot(result, out) if summaries else []
    (out / "study.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    (out / "report.md").write_text(markdown(result, plots))
    return out / "report.md"


def _with_scale(summary: dict) -> dict:
    """A summary with `absolute_reward`; one written before that field gets it from its construction's trainer
    config (None for a construction this version does not know)."""
    if "absolute_reward" not in summary:
        name, study = summary["construction"], parse(StudyConfig, get_config())
        summary["absolute_reward"] = (absolute_reward(run_settings(study, name, summary["seed"]))
                                      if name in RUNS else None)
    return summary
