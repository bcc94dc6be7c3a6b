"""The reproduction study: statistics over seeds by hand, and a smoke run of the command on the tests' toy world
(one construction, one seed, two steps) that resumes without repeating a run."""

import dataclasses
import json
import math
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import TINY_RUN
from rrc_jax.config import parse
from rrc_jax.configs.study import get_config
from rrc_jax.errors import ConfigError
from rrc_jax.study.report import aggregate, interval, run_metrics, supported_orderings, write_report
from rrc_jax.study.runs import StudyConfig, compilation_cache, run_all


def summary(name, seed, evals, rewards, tau=0.5, tokens=100.0, absolute=True):
    return {"construction": name, "seed": seed, "kind": name, "steps": 4, "votes": 1, "beta": 1e-3,
            "judge_temperature": 1.0, "absolute_reward": absolute, "series": {
                "eval/oracle_quality": {str(s): q for s, q in evals.items()},
                "eval/oracle_quality_se": {str(s): 0.01 for s in evals},
                "reward/mean": {str(i + 1): r for i, r in enumerate(rewards)},
                "fidelity/kendall_tau": {"1": tau, "2": tau}, "judge/tokens": {"1": tokens, "2": tokens}}}


def test_intervals_use_students_t():
    mean, half, n = interval([0.5, 0.6, 0.7])
    assert mean == pytest.approx(0.6) and n == 3
    assert half == pytest.approx(4.303 * 0.1 / math.sqrt(3))  # t(0.975, 2) x sd / sqrt(n)
    assert math.isnan(interval([0.4])[1]) and interval([float("nan")])[2] == 0


def test_run_metrics_flag_reward_hacking():
    hacked = run_metrics(summary("drm", 0, {0: 0.5, 2: 0.9, 4: 0.4}, [0.1, 0.2, 0.5, 0.9]))
    assert hacked["final"] == 0.4 and hacked["peak"] == 0.9 and hacked["peak_step"] == 2 and hacked["hacked"] == 1
    assert hacked["fell"] == 1
    honest = run_metrics(summary("agr", 0, {0: 0.5, 2: 0.7, 4: 0.8}, [0.1, 0.2, 0.5, 0.9]))
    assert honest["hacked"] == 0 and honest["fell"] == 0 and honest["kendall_tau"] == 0.5
    assert honest["judge_tokens"] == 100
    # a within-group reward (SCR's win counts) has no scale across steps: hacking is undefined, the fall is not
    relative = run_metrics(summary("scr", 0, {0: 0.5, 2: 0.9, 4: 0.4}, [0.1, 0.2, 0.5, 0.9], absolute=False))
    assert math.isnan(relative["hacked"]) and relative["fell"] == 1


def test_run_metrics_measure_the_late_quarter():
    s = summary("scr", 0, {0: 0.5, 8: 0.6}, [0.0] * 8)
    s["steps"] = 8
    s["series"]["fidelity/kendall_tau"] = {str(k): 0.6 if k <= 2 else 0.1 for k in range(1, 9)}
    s["series"]["response_length"] = {str(k): 5.0 if k <= 2 else 7.0 for k in range(1, 9)}
    m = run_metrics(s)
    assert m["kendall_tau_late"] == pytest.approx(0.1) and m["kendall_tau"] == pytest.approx(0.225)
    assert m["length_gain"] == pytest.approx(2.0)


def test_old_summaries_get_their_reward_scale_from_the_construction():
    from rrc_jax.study.report import _with_scale

    assert _with_scale({"construction": "agr", "seed": 0})["absolute_reward"] is True
    assert _with_scale({"construction": "agr_refresh", "seed": 0})["absolute_reward"] is False
    assert _with_scale({"construction": "scr", "seed": 0})["absolute_reward"] is False
    assert _with_scale({"construction": "drm", "seed": 0})["absolute_reward"] is True
    assert _with_scale({"construction": "mine", "seed": 0})["absolute_reward"] is None


def test_aggregate_states_only_the_orderings_its_intervals_support():
    runs = [summary("agr", s, {0: 0.5, 4: q}, [0, 1]) for s, q in enumerate([0.90, 0.91, 0.92])]
    runs += [summary("prc", s, {0: 0.5, 4: q}, [0, 1], tokens=50.0) for s, q in enumerate([0.80, 0.81, 0.79])]
    runs += [summary("scr", s, {0: 0.5, 4: q}, [0, 1]) for s, q in enumerate([0.70, 0.95, 0.80])]
    result = aggregate(runs)
    assert result["orderings"]["final"] == ["agr > prc"]  # scr's interval overlaps both
    agr = result["constructions"]["agr"]
    assert agr["final"]["mean"] == pytest.approx(0.91) and agr["cost_vs_prc"] == pytest.approx(2.0)
    assert agr["curve"]["4"]["n"] == 3 and agr["seeds"] == [0, 1, 2]
    assert result["orderings"]["peak"] == ["agr > prc"] and result["orderings"]["kendall_tau"] == []
    assert supported_orderings({"a": {"final": {"mean": 0.9, "ci95": float("nan")}},
                                "b": {"final": {"mean": 0.1, "ci95": 0.01}}}) == []  # one seed: no claim


def test_the_frontier_is_the_pareto_optimal_constructions():
    """On random means (some tied, one construction without a judge): a construction is on the frontier of a metric
    iff no other has no more judge tokens and a higher mean, or fewer tokens and an equal mean."""
    from rrc_jax.study.report import frontier

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 8))
        entries = {f"c{i}": {"judge_tokens": {"mean": float(rng.choice([np.nan, 10, 20, 40]))},
                             "final": {"mean": float(rng.choice([0.5, 0.6, 0.7, 0.8]))}} for i in range(n)}
        cost = {k: 0.0 if np.isnan(e["judge_tokens"]["mean"]) else e["judge_tokens"]["mean"]
                for k, e in entries.items()}
        value = {k: e["final"]["mean"] for k, e in entries.items()}
        want = {a for a in entries if not any((cost[b] <= cost[a] and value[b] > value[a]) or
                                              (cost[b] < cost[a] and value[b] >= value[a]) for b in entries)}
        got = frontier(entries, "final")
        assert set(got) == want and [cost[k] for k in got] == sorted(cost[k] for k in got)


def test_report_writes_the_table_and_every_plot(tmp_path):
    runs = [summary("agr", s, {0: 0.5, 4: q}, [0, 1]) for s, q in enumerate([0.90, 0.91, 0.92])]
    prc = summary("prc", 0, {0: 0.5, 4: 0.8}, [0, 1], tokens=50.0)
    prc["series"].update({f"prc/p_bin{k}": {"1": 0.5 if k in (0, 9) else 0.0} for k in range(10)})
    prc["series"]["reward/prc_saturation"] = {"1": 1.0}
    paths = []
    for i, s in enumerate(runs + [prc]):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(s))
    report = write_report(paths, tmp_path / "out", audit={"error_rate": 0.2, "close_error_rate": 0.3,
                                                          "position_inconsistency": 0.25,
                                                          "intransitive_triad_rate": 0.1})
    text = report.read_text()
    assert "| agr | 0.910 ± 0.025 |" in text and "| prc | 0.800 |" in text and "error rate 0.200" in text
    assert "- final quality: none." in text  # prc has one seed: no interval, no claim
    assert "[0.9, 1], Table 6): prc 1.000." in text
    for png in ("quality_vs_step.png", "fidelity.png", "frontier.png", "prc_histogram.png"):
        assert (tmp_path / "out" / png).read_bytes()[:4] == b"\x89PNG" and f"]({png})" in text
    result = json.loads((tmp_path / "out" / "study.json").read_text())
    assert result["constructions"]["prc"]["prc_histogram"][0] == 0.5 and result["runs"] == 4


def test_study_command_runs_reports_and_resumes(tmp_path, toy_cache):
    overrides = ",".join(f"{k}={v}" for k, v in {**TINY_RUN, "toy.cache_dir": toy_cache}.items()
                         if k not in ("steps", "eval.every", "data.eval_prompts"))
    out = tmp_path / "out"
    args = [sys.executable, "-m", "rrc_jax.study", "--config=study.py", f"--config.out={out}",
            f"--config.workdir={tmp_path / 'work'}", "--config.constructions=drm", "--config.seeds=1",
            "--config.steps=2", "--config.eval_every=2", "--config.eval_prompts=16", "--config.audit_pairs=8",
            "--config.audit_groups=2", f"--config.overrides={overrides}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["drm-seed0.json"]
    result = json.loads((out / "study.json").read_text())
    assert set(result["constructions"]) == {"drm"} and result["runs"] == 1
    assert 0 <= result["audit"]["error_rate"] <= 1 and 0 <= result["audit"]["intransitive_triad_rate"] <= 1
    drm = json.loads((out / "runs" / "drm-seed0.json").read_text())
    assert drm["kind"] == "drm" and drm["beta"] == 0.0  # TINY_RUN's override
    # the summary keeps its run's trainer fields and the study's overrides, but no path of this machine
    assert drm["config"]["rl.beta"] == 0.0 and drm["config"]["steps"] == 2 and "workdir" not in drm["config"]
    assert drm["overrides"]["rl.group_size"] == 4 and "toy.cache_dir" not in drm["overrides"]
    assert "Every run also sets " in (out / "report.md").read_text() and "`rl.group_size=4`" in (
        out / "report.md").read_text()
    assert set(drm["series"]["eval/oracle_quality"]) == {"0", "2"} and "fidelity/advantage_error" in drm["series"]
    assert "| drm |" in (out / "report.md").read_text()
    for png in ("quality_vs_step.png", "fidelity.png", "frontier.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    stamp = (out / "runs" / "drm-seed0.json").stat().st_mtime_ns
    study = get_config()  # again, in process: every run has its summary, so none is repeated
    study.update_from_flattened_dict({"out": str(out), "workdir": str(tmp_path / "work"), "seeds": 1,
                                      "steps": 2, "eval_every": 2, "eval_prompts": 16, "constructions": "drm",
                                      "audit_pairs": 8, "audit_groups": 2, "overrides": overrides})
    assert len(run_all(study)) == 1 and (out / "runs" / "drm-seed0.json").stat().st_mtime_ns == stamp
    # the judge's audit is made again only for other sizes or another judge
    from rrc_jax.study.runs import audit_judge

    audit_stamp = (out / "audit.json").stat().st_mtime_ns
    assert audit_judge(parse(StudyConfig, study))["made_with"]["pairs"] == 8
    assert (out / "audit.json").stat().st_mtime_ns == audit_stamp
    study.audit_pairs = 4
    assert audit_judge(parse(StudyConfig, study))["pairs"] == 4.0
    study.overrides = overrides.replace("rl.group_size=4", "rl.group_size=2")  # another run than the summary's
    with pytest.raises(ConfigError, match=r"drm-seed0.json was made by another run.*rl.group_size: 4 -> 2"):
        run_all(study)
    study.overrides = overrides
    study.constructions = "agr,nope"
    with pytest.raises(ConfigError, match="nope"):
        run_all(study)


def test_a_summary_is_reused_only_for_the_run_that_made_it(tmp_path):
    """A study reuses a summary in its `out` only when the run that made it had the trainer fields this study's run
    would have (its paths and what a resume may change aside); one made before summaries kept their fields is
    compared on those it kept. Otherwise it stops before running anything and names the field."""
    from rrc_jax.study.runs import run_fields, run_settings, summary_changes

    study = parse(StudyConfig, get_config().copy_and_resolve_references())
    study = dataclasses.replace(study, out=str(tmp_path / "out"), workdir=str(tmp_path / "work"),
                                constructions="scr", seeds=1)
    settings = run_settings(study, "scr", 0)
    same = {**summary("scr", 0, {0: 0.5}, [0]), "config": {**run_fields(settings), "log.samples_every": 7,
                                                           "rl.remat": True, "a field of a later rrc-jax": 1}}
    assert summary_changes(same, settings) == [] and "toy.cache_dir" not in same["config"]
    path = tmp_path / "out" / "runs" / "scr-seed0.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(same))
    assert run_all(study) == [path]  # reused: no trainer run (no toy world is built here)
    for field, value, said in (("rl.learning_rate", 1e-4, "rl.learning_rate: 0.0001 -> 0.0002"),
                               ("eval.every", 10, "eval.every: 10 -> 5"), ("steps", 20, "steps: 20 -> 40")):
        path.write_text(json.dumps({**same, "config": {**same["config"], field: value}}))
        with pytest.raises(ConfigError, match=f"scr-seed0.json was made by another run.*{re.escape(said)}.*config.out"):
            run_all(study)
    legacy = {k: v for k, v in summary("scr", 0, {0: 0.5}, [0]).items() if k != "config"}
    legacy.update(kind="scr", steps=40, votes=1, beta=settings.grpo.beta, judge_temperature=1.0)
    assert summary_changes(legacy, settings) == []
    assert summary_changes({**legacy, "votes": 4}, settings) == ["votes: 4 -> 1"]


def test_the_report_says_which_trainer_fields_the_study_set():
    from rrc_jax.study.report import overrides_lines, study_overrides

    runs = [summary(n, s, {0: 0.5}, [0]) for n in ("agr", "scr") for s in range(2)]
    assert overrides_lines(study_overrides(runs)) == []  # summaries from before they kept them: nothing to say
    for r in runs:
        r["overrides"] = {"rl.learning_rate": 1e-4, "toy.train_prompts": 256}
    assert overrides_lines(study_overrides(runs)) == [
        "", "Every run also sets `rl.learning_rate=0.0001`, `toy.train_prompts=256` (the study's `overrides`)."]
    runs[2]["overrides"] = runs[3]["overrides"] = {}
    assert overrides_lines(study_overrides(runs))[1] == (
        "The runs differ in the study's `overrides`: `rl.learning_rate=0.0001`, `toy.train_prompts=256` (agr); "
        "none (scr).")


def test_quick_is_fewer_seeds_and_steps_in_folders_of_its_own():
    from rrc_jax.configs.study import quick

    full, small = get_config(), quick(get_config())
    assert (small.seeds, small.steps) < (full.seeds, full.steps) and small.out == full.out + "_quick"
    assert small.overrides == "toy.train_prompts=256" and get_config("quick").to_dict() == small.to_dict()


def test_the_asynchronous_runs_sit_beside_their_synchronous_construction():
    """`scr_stale1` is SCR at k = 1: its row follows SCR's, with its staleness, its steps per minute (from
    `time/step`; SCR's from its phases' seconds) and whether its final quality lies in SCR's interval, said plainly
    when it does not."""
    from rrc_jax.study.report import stale_lines, within

    runs = []
    for s in range(2):
        sync = summary("scr", s, {0: 0.5, 4: 0.9}, [0, 1])
        sync["series"].update({"time/rollout": {"1": 1.0}, "time/reward": {"1": 4.0}, "time/update": {"1": 1.0}})
        stale = summary("scr_stale1", s, {0: 0.5, 4: 0.8}, [0, 1])
        stale["series"].update({"time/step": {"1": 4.0, "2": 4.0}, "staleness/mean": {"1": 0.0, "2": 1.0}})
        runs += [sync, stale]
    entries = aggregate(runs)["constructions"]
    assert entries["scr"]["steps_per_minute"]["mean"] == 10.0
    assert entries["scr_stale1"]["steps_per_minute"]["mean"] == 15.0
    rows = [line for line in stale_lines(entries) if line.startswith("| scr |")]
    assert rows[0].startswith("| scr | 0 | 0.900 ± 0.000 |  |") and rows[0].endswith("| 0.00 ± 0.00 | 10.00 ± 0.00 |")
    assert rows[1].startswith("| scr | 1 | 0.800 ± 0.000 | below |")
    assert rows[1].endswith("| 0.50 ± 0.00 | 15.00 ± 0.00 |")
    assert stale_lines(entries)[-1] == ("Final quality outside the k = 0 interval: scr at k = 1 (0.800 ± 0.000, "
                                        "below 0.900 ± 0.000).")
    assert stale_lines({"scr": entries["scr"]}) == []
    base = {"mean": 0.9, "ci95": 0.1}
    assert [within({"mean": m}, base) for m in (0.85, 0.75, 1.01)] == ["yes", "below", "above"]
    assert within({"mean": 0.9}, {"mean": 0.9, "ci95": float("nan")}) == "n/a"  # one seed: no interval


def test_the_study_keeps_compiled_programs_in_its_workdir_unless_jax_has_a_cache(tmp_path):
    study = parse(StudyConfig, get_config())
    configured = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert compilation_cache(dataclasses.replace(study, compilation_cache=False)) == ""
        assert jax.config.jax_compilation_cache_dir is None
        mine = dataclasses.replace(study, workdir=str(tmp_path / "work"))
        assert compilation_cache(mine) == str(tmp_path / "work" / "xla_cache") == jax.config.jax_compilation_cache_dir
        assert (tmp_path / "work" / "xla_cache").is_dir() and jax.config.jax_persistent_cache_min_compile_time_secs == 0
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "users"))  # JAX_COMPILATION_CACHE_DIR's
        assert compilation_cache(dataclasses.replace(mine, workdir=str(tmp_path / "other"))) == str(tmp_path / "users")
        assert not (tmp_path / "other").exists()
    finally:
        jax.config.update("jax_compilation_cache_dir", configured[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", configured[1])


def test_the_report_says_plainly_which_cheap_construction_reaches_the_round_robins_tau():
    """`half_cost_lines`: the constructions at <= half SCR's questions, each beside SCR's tau interval; the reaching
    ones named, or, when none does, the closest and its shortfall below the interval's lower end."""
    from rrc_jax.study.report import half_cost_lines

    def runs(name, questions, taus):
        out = []
        for s, tau in enumerate(taus):
            run = summary(name, s, {0: 0.5, 4: 0.8}, [0, 1], tau=tau)
            run["series"]["judge/questions"] = {"1": questions, "2": questions}
            out.append(run)
        return out

    base = runs("scr", 448, [0.38, 0.40, 0.42])  # tau 0.40 +- 0.050
    cheap = runs("active_half", 224, [0.30, 0.32, 0.34]) + runs("swiss", 192, [0.30, 0.30, 0.30])
    lines = "\n".join(half_cost_lines(aggregate(base + cheap + runs("agr", 1024, [0.5] * 3))["constructions"]))
    assert "| swiss | 192 | 0.43 | 0.300 ± 0.000 | below |" in lines and "| agr |" not in lines
    assert "None reaches the round robin's tau interval (0.350 to 0.450)" in lines
    assert "the closest, active_half (0.50x), has tau 0.320 ± 0.050, 0.030 below" in lines
    lines = half_cost_lines(aggregate(base + runs("active_half", 224, [0.36, 0.37, 0.38]))["constructions"])
    assert lines[-1] == "Within the round robin's tau interval at <= 0.5x its questions: active_half."


def test_a_run_of_another_learner_is_not_held_against_the_round_robin():
    """`swiss_gspo` ranks a GSPO policy's rollouts: its tau (above SCR's interval here) is left out of the
    comparison with SCR's GRPO round robin (`learner_fields` from the construction's trainer config)."""
    from rrc_jax.study.report import half_cost_lines, learner_fields

    runs = []
    for name, questions, tau in (("scr", 448, 0.40), ("swiss_gspo", 192, 0.60), ("swiss", 192, 0.30)):
        for s in range(3):
            run = summary(name, s, {0: 0.5, 4: 0.8}, [0, 1], tau=tau + 0.01 * s)
            run["series"]["judge/questions"] = {"1": questions}
            runs.append(run)
    assert learner_fields(runs[3])["rl.loss"] == "gspo" and learner_fields(runs[0])["rl.loss"] == "grpo"
    lines = "\n".join(half_cost_lines(aggregate(runs)["constructions"]))
    assert "| swiss |" in lines and "swiss_gspo" not in lines and "None reaches" in lines


def test_the_committed_report_is_made_from_the_committed_summaries(tmp_path):
    """results/study/report.md and study.json are what the report makes of the committed run summaries (in the
    study's order) and audit: a change to the report's code or to a summary shows here."""
    from pathlib import Path

    from rrc_jax.study.runs import plan, summary_path

    root = Path(__file__).resolve().parents[1] / "results" / "study"
    study = dataclasses.replace(parse(StudyConfig, get_config()), out=str(root))
    paths = [p for p in (summary_path(study, n, s) for n, s in plan(study)) if p.is_file()]
    assert len(paths) == 150
    write_report(paths, tmp_path, json.loads((root / "audit.json").read_text()))
    assert (tmp_path / "report.md").read_text() == (root / "report.md").read_text()
    assert json.loads((tmp_path / "study.json").read_text()) == json.loads((root / "study.json").read_text())
