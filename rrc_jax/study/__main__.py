"""The study's command line.

    python -m rrc_jax.study --config=study.py [--quick] [--config.shard=0/2 --config.constructions=agr,prc ...]

Runs this shard's unfinished runs (`rrc_jax.study.runs`), audits the toy judge once (`out/audit.json`), and writes
the report from every summary present (`rrc_jax.study.report`): `out/report.md`, `out/study.json`, the PNGs.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from absl import flags

from rrc_jax import cli
from rrc_jax.config import parse
from rrc_jax.configs.study import quick
from rrc_jax.data.toy.audit import audit
from rrc_jax.inference import role_sampler
from rrc_jax.judge import Judge
from rrc_jax.rl.roles import Roles
from rrc_jax.study.report import write_report
from rrc_jax.study.runs import StudyConfig, compilation_cache, plan, run_all, run_fields, run_settings

CONFIG = cli.config_flag("study.py", "The study's config")
QUICK = flags.DEFINE_bool("quick", False, "fewer seeds and steps (study.py:quick's sizes), into out/workdir _quick")


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


def run_study(study: StudyConfig) -> Path:
    cache = compilation_cache(study)
    if cache:
        print(f"study: compiled programs cached in {cache}", file=sys.stderr)
    summaries = run_all(study)
    if not study.report:
        return Path(study.out)
    report = write_report(summaries, Path(study.out), audit_judge(study))
    print(f"study: {len(summaries)} run summaries; report in {report}", file=sys.stderr)
    return report


def main(argv) -> None:
    config = cli.config_value(CONFIG, argv, "study.py")
    if QUICK.value:
        config = quick(config.copy_and_resolve_references())
    cli.exit_on_user_error(run_study, cli.exit_on_user_error(parse, StudyConfig, config))


if __name__ == "__main__":
    cli.start(main)
