"""The study's runs: every reward construction (`RUNS`) x seeds, each a trainer run on the toy world; the per-run
summary the report is built from; and the audit of the toy judge the runs ask (`audit_judge`).

A run is `(construction, seed)`; its trainer workdir is `workdir/<construction>/seed<k>` (checkpoints: an
interrupted run resumes) and its summary `out/runs/<construction>-seed<k>.json` (small; a run with a summary is
never repeated, so a study resumes where it stopped, in a later invocation; a summary made with other trainer
fields than the study's run would have is refused, `summary_changes`). Runs are split across processes by
`shard = INDEX/COUNT`: run i belongs to shard i % COUNT.

Every run uses the trainer's defaults (the toy world, KL on) with the judge asked once per question (`votes=1`, the
paper's single query) unless the construction votes; seeds change the policy's sampling, the judge's sampling and
the prompt order, not the toy world (one world, built once).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import jax

from rrc_jax.config import TrainerSettings, base_config, config_record, validate
from rrc_jax.data.toy.audit import audit
from rrc_jax.errors import ConfigError
from rrc_jax.inference import role_sampler
from rrc_jax.judge import Judge
from rrc_jax.rl.roles import Roles
from rrc_jax.rl.trainer import run
from rrc_jax.settings import flat_fields
from rrc_jax.workdir import RESUMABLE_CHANGES

# name -> (reward kind, trainer overrides)
RUNS: dict[str, tuple[str, dict]] = {
    "drm": ("drm", {}),
    "prc": ("prc", {}),
    "prc_direct": ("prc", {"reward.prc.think": False}),
    "scr": ("scr", {}),
    "scr_vote4": ("scr", {"reward.judge.votes": 4}),
    "scr_vote8": ("scr", {"reward.judge.votes": 8}),
    "scr_cara": ("scr", {"reward.scr.cara": True}),
    "scr_cara_exact": ("scr", {"reward.scr.cara": True, "reward.scr.cara_method": "exact"}),
    "merge_sort": ("scr", {"reward.scr.ordering": "merge_sort"}),
    "knockout": ("scr", {"reward.scr.ordering": "knockout"}),
    "agr": ("agr", {}),
    "agr_vote4": ("agr", {"reward.judge.votes": 4}),
    "agr_vote8": ("agr", {"reward.judge.votes": 8}),
    "agr_refresh": ("agr", {"reward.agr.refresh_every": "steps/4"}),  # 4 refreshes a run (every 10 of 40 steps)
    # the tournaments of other systems (`rrc_jax.constructions.tournaments`): their cost and fidelity side by side
    "swiss": ("swiss", {}),
    "double_elimination": ("double_elimination", {}),
    "seeded_knockout": ("seeded_knockout", {}),
    "circular": ("circular", {}),
    # the peers' learners in place of GRPO's (`rl.loss`, `rl.advantage`), with SCR and with the tournament of the
    # four above with the highest mean Kendall tau and final quality (Swiss: docs/study.md)
    "scr_gspo": ("scr", {"rl.loss": "gspo"}),
    "scr_rloo": ("scr", {"rl.advantage": "rloo"}),
    "swiss_gspo": ("swiss", {"rl.loss": "gspo"}),
    "swiss_rloo": ("swiss", {"rl.advantage": "rloo"}),
    # adaptive schedules (`rrc_jax.constructions.adaptive`) at two budgets each: the Bradley-Terry active round robin
    # at half the round robin's pairs (14 of 28) and at Swiss's 12 (three rounds); AGR's anchors stopped at a
    # posterior sd of 1 and 1.5 anchors
    "active_half": ("active", {"reward.active.budget": 0.5}),
    "active_three_rounds": ("active", {"reward.active.budget": 0.43}),
    "agr_sequential": ("agr_sequential", {"reward.agr_sequential.tolerance": 1.0}),
    "agr_sequential_loose": ("agr_sequential", {"reward.agr_sequential.tolerance": 1.5}),
    # the asynchronous step (`rl.max_staleness`, docs/async.md): rollouts 1 and 2 updates ahead of the learner
    "scr_stale1": ("scr", {"rl.max_staleness": 1}),
    "scr_stale2": ("scr", {"rl.max_staleness": 2}),
    "agr_stale1": ("agr", {"rl.max_staleness": 1}),
    "agr_stale2": ("agr", {"rl.max_staleness": 2}),
}

# the per-step series a summary keeps (those a run logged)
SERIES = ("reward/mean", "oracle_quality", "fidelity/kendall_tau", "fidelity/advantage_error", "judge/questions",
          "judge/tokens", "judge/tolerance_stops", "time/rollout", "time/reward", "time/update", "time/step",
          "staleness/mean", "reward/prc_saturation", "kl", "response_length", "eval/oracle_quality",
          "eval/oracle_quality_se",
          *(f"prc/p_bin{k}" for k in range(10)))


# Trainer fields in which two runs may differ and still be one run of the study: where they write and find the toy
# world, and what a resume may change (`RESUMABLE_CHANGES`: it does not alter the optimization) but the length and
# the evaluations, which a summary holds. Paths are machine-specific: a summary does not keep these two.
PLACES = ("workdir", "toy.cache_dir")
SAME_RUN = (*PLACES, *(p for p in RESUMABLE_CHANGES if p not in ("steps", "eval.")))
# what a summary written before it held its run's trainer fields (`config`) can be compared on
_LEGACY = {"kind": lambda s: s.reward_kind, "steps": lambda s: s.steps, "votes": lambda s: s.judge.votes,
           "beta": lambda s: s.grpo.beta, "judge_temperature": lambda s: s.judge.temperature}


def constructions(spec: str) -> list[str]:
    """The names picked by `spec` ('all', or a comma-separated list of `RUNS` keys)."""
    if spec == "all":
        return list(RUNS)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNS]
    if unknown or not names:
        raise ConfigError(f"config.constructions: unknown {unknown or spec!r}; use 'all' or some of "
                          f"{', '.join(RUNS)}")
    return names


def parse_shard(shard: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in shard.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise ConfigError(f"config.shard: {shard!r}; use INDEX/COUNT with 0 <= INDEX < COUNT, e.g. 0/2")
    return index, count


@dataclasses.dataclass(frozen=True)
class StudyConfig:
    """A study (`configs/study.py`, whose comments say what each field does): which constructions, how many seeds
    and steps, where the runs and the report go, this process's shard, and trainer fields for every run."""

    GROUP = ""  # the config's top level
    out: str = "results/study"
    workdir: str = "workdir/study"
    constructions: str = "all"
    seeds: int = 5
    steps: int = 40
    eval_every: int = 5
    eval_prompts: int = 256
    shard: str = "0/1"
    report: bool = True
    audit_pairs: int = 512
    audit_groups: int = 64
    overrides: str = ""
    compilation_cache: bool = True

    def __post_init__(self):
        constructions(self.constructions), parse_shard(self.shard)
        for name in ("seeds", "steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config.{name}: {getattr(self, name)} must be >= 1")


def parse_overrides(text: str, flat: dict) -> dict:
    """`"FIELD=VALUE,..."` as a flat dict, each value cast to the type of its field in `flat` (a trainer config's
    `flat_fields`)."""
    out = {}
    for item in (x for x in text.split(",") if x.strip()):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in flat:
            raise ConfigError(f"config.overrides: {item.strip()!r}; give FIELD=VALUE with a trainer config field")
        kind = type(flat[key])
        out[key] = (value.strip() in ("True", "true", "1")) if kind is bool else kind(value.strip())
    return out


def plan(study: StudyConfig) -> list[tuple[str, int]]:
    """Every run of the study, in a fixed order (constructions, then seeds)."""
    return [(name, seed) for name in constructions(study.constructions) for seed in range(study.seeds)]


def run_settings(study: StudyConfig, name: str, seed: int) -> TrainerSettings:
    """The trainer settings of run (`name`, `seed`): the trainer's defaults for the construction's kind, the study's
    sizes, the construction's overrides and then the study's."""
    kind, overrides = RUNS[name]
    overrides = {k: max(1, study.steps // 4) if v == "steps/4" else v for k, v in overrides.items()}
    c = base_config(kind)
    c.update_from_flattened_dict({
        "workdir": str(Path(study.workdir) / name / f"seed{seed}"), "seed": seed, "steps": study.steps,
        "eval.every": study.eval_every, "data.eval_prompts": study.eval_prompts, "reward.judge.votes": 1,
        "checkpoint.save_every": max(study.eval_every, 5), **overrides})
    c.update_from_flattened_dict(parse_overrides(study.overrides, flat_fields(config_record(c))))
    return validate(c)


def absolute_reward(s: TrainerSettings) -> bool | None:
    """Whether the run's reward keeps one scale across steps, so that its mean rising says the judge (or DRM) rates
    the policy higher: the DRM, a pointwise judge, AGR against fixed anchors, PRC against the frozen initial
    policy. Win counts within a group (SCR, tournaments, CARA) and PRC against the current policy are relative:
    their mean says nothing of the kind (`Construction.absolute_scale`; None for a plug-in that does not say)."""
    return s.reward.absolute_scale(s)


def summary_path(study: StudyConfig, name: str, seed: int) -> Path:
    return Path(study.out) / "runs" / f"{name}-seed{seed}.json"


def run_fields(s: TrainerSettings) -> dict:
    """A run's trainer config as flat fields (`flat_fields` of its record), less `PLACES`: what its summary keeps."""
    return {k: v for k, v in flat_fields(s.record).items() if k not in PLACES}


def summary_changes(summary: dict, s: TrainerSettings) -> list[str]:
    """`FIELD: SUMMARY'S -> NOW` for each trainer field (but `SAME_RUN`'s) in which the run that made `summary`
    differs from the run `s` the study would make now. A summary written before summaries kept their run's fields
    is compared on the ones it kept (`_LEGACY`); a field only one side has (added or removed by an upgrade of
    rrc-jax) is not a change."""
    if "config" in summary:
        then, now = summary["config"], run_fields(s)
    else:
        then, now = summary, {k: read(s) for k, read in _LEGACY.items()}
    return [f"{k}: {then[k]!r} -> {now[k]!r}" for k in sorted(then.keys() & now.keys())
            if then[k] != now[k] and not k.startswith(SAME_RUN)]


def summarize(workdir: Path, name: str, seed: int, s: TrainerSettings, overrides: dict | None = None) -> dict:
    """A finished run's summary: its construction, seed, the fields that define it (`config`: all of its trainer
    config's, less `PLACES`; `overrides`: those the study set for every run), and `SERIES` by step."""
    rows: dict[int, dict] = {}
    for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)
    series = {k: {str(s): r[k] for s, r in sorted(rows.items()) if k in r and _finite(r[k])} for k in SERIES}
    return {"construction": name, "seed": seed, "kind": s.reward_kind, "steps": s.steps, "votes": s.judge.votes,
            "beta": s.grpo.beta, "judge_temperature": s.judge.temperature, "absolute_reward": absolute_reward(s),
            "overrides": {k: v for k, v in (overrides or {}).items() if k not in PLACES}, "config": run_fields(s),
            "series": {k: v for k, v in series.items() if v}}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def audit_judge(study: StudyConfig) -> dict:
    """The toy GRM's imperfection (`rrc_jax.data.toy.audit`) as the study's runs ask it, cached in
    `out/audit.json` with what it was made with (`made_with`: the audit's sizes and the run's `reward.judge`,
    `toy` and `models` fields); a cached audit made with anything else is made again."""
    path = Path(study.out) / "audit.json"
    s = run_settings(study, *plan(study)[0])
    made_with = {"pairs": study.audit_pairs, "groups": study.audit_groups,
                 **{k: v for k, v in run_fields(s).items() if k.startswith(("reward.judge.", "toy.", "models."))}}
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached.get("made_with") == made_with:
            return cached
    roles, j, task = Roles.of_run(s), s.judge, s.toy.task.task
    sampler = role_sampler(roles, "grm", engine=s.inference)
    judge = Judge(sampler, roles.tokenizer("grm"), dataclasses.replace(j, seed=0))
    result = {"temperature": j.temperature, **audit(judge, task, pairs=study.audit_pairs,
                                                    groups=study.audit_groups), "made_with": made_with}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def compilation_cache(study: StudyConfig) -> str:
    """Turn on JAX's persistent compilation cache in `workdir/xla_cache` (`study.compilation_cache`), unless JAX
    has one already (`JAX_COMPILATION_CACHE_DIR`, kept as it is). The runs share their programs (one toy world), a
    run's judge meets new question shapes as its responses change length, and each run drops its programs from
    memory when it ends (`run_all`): without the cache, most of a run's time is compiling what an earlier run
    compiled. A cached program is the same executable, so the runs' metrics do not change. Returns the cache's
    directory ("" when there is none)."""
    if jax.config.jax_compilation_cache_dir or not study.compilation_cache:
        return jax.config.jax_compilation_cache_dir or ""
    path = Path(study.workdir) / "xla_cache"
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # every program: most compile in under 1 s
    return str(path)


def run_all(study: StudyConfig) -> list[Path]:
    """Run this shard's unfinished runs (one after another) and write each summary; returns every summary path of
    the study that exists afterwards. A `ConfigError` names a summary already in `out` that another run made
    (`summary_changes`) before any run starts."""
    index, count = parse_shard(study.shard)
    runs = plan(study)
    mine = [(name, seed, run_settings(study, name, seed)) for i, (name, seed) in enumerate(runs) if i % count == index]
    for name, seed, settings in mine:
        path = summary_path(study, name, seed)
        changes = summary_changes(json.loads(path.read_text()), settings) if path.is_file() else []
        if changes:
            raise ConfigError(f"study: {path} was made by another run than this study's {name}, seed {seed} "
                              f"({'; '.join(changes[:4])}{'; ...' if len(changes) > 4 else ''}): give this study an "
                              "out and a workdir of its own (--config.out, --config.workdir), or delete that summary "
                              "to run it again")
    for k, (name, seed, settings) in enumerate(mine):
        path = summary_path(study, name, seed)
        if path.is_file():
            continue
        print(f"study: run {k + 1}/{len(mine)} of shard {index}/{count}: {name}, seed {seed}", file=sys.stderr)
        workdir = run(settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = summarize(Path(workdir), name, seed, settings,
                            parse_overrides(study.overrides, flat_fields(settings.record)))
        path.write_text(json.dumps(summary) + "\n")
        # the run's compiled programs go with it: XLA:CPU keeps each one's code mapped while JAX caches it, and a
        # process of dozens of runs would reach the kernel's limit of memory mappings (vm.max_map_count)
        jax.clear_caches()
    return [p for p in (summary_path(study, n, s) for n, s in runs) if p.is_file()]
