"""The study's command line.

    python -m rrc_jax.study --config=study.py [--quick] [--config.shard=0/2 --config.constructions=agr,prc ...]

Runs this shard's unfinished runs (`rrc_jax.study.runs`), audits the toy judge once (`out/audit.json`), and writes
the report from every summary present (`rrc_jax.study.report`): `out/report.md`, `out/study.json`, the PNGs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

from rrc_jax import cli
from rrc_jax.config import parse
from rrc_jax.configs.study import quick
from rrc_jax.study.report import write_report
from rrc_jax.study.runs import StudyConfig, audit_judge, compilation_cache, run_all

CONFIG = cli.config_flag("study.py", "The study's config")
QUICK = flags.DEFINE_bool("quick", False, "fewer seeds and steps (study.py:quick's sizes), into out/workdir _quick")


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
