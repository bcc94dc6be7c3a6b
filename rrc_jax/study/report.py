"""The study's report: per construction, statistics over seeds (mean and 95% confidence interval), the orderings the
intervals support, and the plots.

Per run (from its summary, `rrc_jax.study.runs.summarize`):
- `final`: held-out oracle quality at the last evaluation; `peak`: its largest value; `peak_step`: where;
- `kendall_tau`, `advantage_error`: reward fidelity (`rrc_jax.rl.fidelity`), averaged over the run's steps;
- `prc_saturation`: the share of P(A) in [0, 0.1] or [0.9, 1] (PRC runs; Table 6), averaged over steps;
- `questions`, `judge_tokens`, `reward_seconds`: judge cost per step;
- `hacked`: the reward rose (its mean over the second half of the steps above the first half's) while held-out
  quality fell from its peak by more than twice the final evaluation's standard error.

Per construction, each number's mean over seeds and the half-width of its 95% interval, `t(0.975, n - 1) x sd /
sqrt(n)` (Student's t: seeds are few). `orderings` lists the pairs whose final-quality intervals do not overlap;
any other pair cannot be told apart at this number of seeds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

# Student's t quantile t(0.975, df) for df = 1..30 (beyond: 1.96 is within 4%).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
METRICS = ("final", "peak", "peak_step", "kendall_tau", "advantage_error", "prc_saturation", "questions",
           "judge_tokens", "reward_seconds", "hacked")


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


def _mean_series(summary: dict, key: str) -> float:
    s = summary["series"].get(key)
    return float(np.mean(list(s.values()))) if s else math.nan


def run_metrics(summary: dict) -> dict[str, float]:
    """One run's numbers (module docstring)."""
    out = {k: math.nan for k in METRICS}
    ev = summary["series"].get("eval/oracle_quality")
    if ev:
        steps, q = _steps(ev)
        out["final"], out["peak"], out["peak_step"] = float(q[-1]), float(q.max()), float(steps[q.argmax()])
        se = summary["series"].get("eval/oracle_quality_se", {}).get(str(steps[-1]), 0.0)
        reward = summary["series"].get("reward/mean")
        if reward and len(reward) >= 2:
            _, r = _steps(reward)
            half = len(r) // 2
            out["hacked"] = float(r[half:].mean() > r[:half].mean() and q[-1] < q.max() - 2 * se)
    out["kendall_tau"] = _mean_series(summary, "fidelity/kendall_tau")
    out["advantage_error"] = _mean_series(summary, "fidelity/advantage_error")
    out["prc_saturation"] = _mean_series(summary, "reward/prc_saturation")
    out["questions"] = _mean_series(summary, "judge/questions")
    out["judge_tokens"] = _mean_series(summary, "judge/tokens")
    out["reward_seconds"] = _mean_series(summary, "time/reward")
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
        entry = {"seeds": sorted(s["seed"] for s in runs), "kind": runs[0]["kind"], "votes": runs[0]["votes"]}
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
    prc = out["constructions"].get("prc", {}).get("judge_tokens", {}).get("mean", math.nan)
    for entry in out["constructions"].values():
        entry["cost_vs_prc"] = entry["judge_tokens"]["mean"] / prc if prc and math.isfinite(prc) else math.nan
    out["orderings"] = supported_orderings(out["constructions"])
    return out


def supported_orderings(entries: dict) -> list[str]:
    """'A > B' for every pair whose final-quality 95% intervals do not overlap, best first."""
    lo = {n: e["final"]["mean"] - e["final"]["ci95"] for n, e in entries.items()}
    hi = {n: e["final"]["mean"] + e["final"]["ci95"] for n, e in entries.items()}
    names = sorted(entries, key=lambda n: -entries[n]["final"]["mean"])
    return [f"{a} > {b}" for i, a in enumerate(names) for b in names[i + 1:]
            if math.isfinite(lo[a]) and math.isfinite(hi[b]) and lo[a] > hi[b]]


def _fmt(m: dict, digits: int = 3) -> str:
    if not math.isfinite(m["mean"]):
        return "n/a"
    return f"{m['mean']:.{digits}f}" + (f" ± {m['ci95']:.{digits}f}" if math.isfinite(m["ci95"]) else "")


def markdown(result: dict, plots: list[str]) -> str:
    """The report: the table, the supported orderings, the judge audit when present, and the plots."""
    lines = ["# Reproduction study", "", f"Runs: {result['runs']} ({result['seeds_per_construction']} seeds per "
             f"construction, {result['steps']} steps). Mean ± 95% interval over seeds.", "",
             "| construction | final quality | peak quality | peak step | Kendall tau | advantage error | "
             "hacked runs | questions / step | judge tokens / step | cost vs PRC |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, e in result["constructions"].items():
        h, cost = e["hacked"], e["cost_vs_prc"]
        hacked = f"{h['mean'] * h['n']:.0f} / {h['n']}" if h["n"] else "n/a"
        lines.append(
            f"| {name} | {_fmt(e['final'])} | {_fmt(e['peak'])} | {_fmt(e['peak_step'], 0)} | "
            f"{_fmt(e['kendall_tau'])} | {_fmt(e['advantage_error'])} | {hacked} | {_fmt(e['questions'], 0)} | "
            f"{_fmt(e['judge_tokens'], 0)} | {f'{cost:.2f}' if math.isfinite(cost) else 'n/a'} |")
    lines += ["", "Orderings the intervals support (final quality): "
              + ("; ".join(result["orderings"]) if result["orderings"] else "none") + ".", ""]
    if result.get("audit"):
        a = result["audit"]
        lines += ["The toy judge (`rrc_jax.data.toy.audit`): "
                  f"error rate {a['error_rate']:.3f} ({a['close_error_rate']:.3f} on close pairs), position "
                  f"inconsistency {a['position_inconsistency']:.3f}, intransitive triads "
                  f"{a['intransitive_triad_rate']:.3f}.", ""]
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def plot(result: dict, out: Path) -> list[str]:
    """The PNGs (file names, in `out`): quality vs step with 95% bands, reward fidelity, cost vs quality, and the
    PRC probability histogram (when a PRC construction ran)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = result["constructions"]
    names = list(entries)
    files = []

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for name in names:
        curve = entries[name]["curve"]
        steps = np.array(sorted(int(s) for s in curve))
        mean = np.array([curve[str(s)]["mean"] for s in steps])
        half = np.nan_to_num(np.array([curve[str(s)]["ci95"] for s in steps]))
        ax.plot(steps, mean, marker="o", ms=3, label=name)
        ax.fill_between(steps, mean - half, mean + half, alpha=0.15)
    ax.set(xlabel="step", ylabel="held-out oracle quality", title="Oracle quality (mean, 95% interval over seeds)")
    ax.legend(fontsize=7, ncol=2)
    files.append(_save(fig, out / "quality_vs_step.png"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, label in ((axes[0], "kendall_tau", "Kendall tau (reward vs oracle, within group)"),
                           (axes[1], "advantage_error", "advantage error (RMS vs oracle advantages)")):
        means = [entries[n][key]["mean"] for n in names]
        halves = np.nan_to_num([entries[n][key]["ci95"] for n in names])
        ax.barh(names, means, xerr=halves, color="tab:blue", alpha=0.7)
        ax.set(title=label)
        ax.invert_yaxis()
    files.append(_save(fig, out / "fidelity.png"))

    fig, ax = plt.subplots(figsize=(7, 5))
    for name in names:
        e = entries[name]
        ax.errorbar(max(e["judge_tokens"]["mean"], 1.0), e["final"]["mean"],
                    yerr=np.nan_to_num(e["final"]["ci95"]), fmt="o", capsize=3)
        ax.annotate(name, (max(e["judge_tokens"]["mean"], 1.0), e["final"]["mean"]), fontsize=7)
    ax.set(xscale="log", xlabel="judge tokens per step", ylabel="final held-out oracle quality",
           title="Cost vs quality")
    files.append(_save(fig, out / "cost_vs_quality.png"))

    hists = {n: e["prc_histogram"] for n, e in entries.items() if "prc_histogram" in e}
    if hists:
        fig, ax = plt.subplots(figsize=(7, 4))
        width = 0.8 / len(hists)
        for k, (name, h) in enumerate(hists.items()):
            ax.bar(np.arange(10) / 10 + 0.05 + (k - (len(hists) - 1) / 2) * width / 10, h, width=width / 10,
                   label=name)
        ax.set(xlabel="P(A)", ylabel="share of judgments", title="PRC probabilities (Table 6)")
        ax.legend()
        files.append(_save(fig, out / "prc_histogram.png"))
    return files


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def write_report(summary_paths: list[Path], out: Path, audit: dict | None = None) -> Path:
    """`out/study.json` (every construction's statistics, the audit), the plots and `out/report.md`."""
    summaries = [json.loads(Path(p).read_text()) for p in summary_paths]
    result = aggregate(summaries)
    per = {n: len(e["seeds"]) for n, e in result["constructions"].items()}
    result.update(runs=len(summaries), seeds_per_construction=min(per.values()) if per else 0,
                  steps=max((s["steps"] for s in summaries), default=0), audit=audit)
    out.mkdir(parents=True, exist_ok=True)
    plots = plot(result, out) if summaries else []
    (out / "study.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    (out / "report.md").write_text(markdown(result, plots))
    return out / "report.md"
