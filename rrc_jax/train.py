"""GRPO with rewards from a generative reward model (RRC) or the DRM / PRC baselines: the main job.

    python -m rrc_jax.train --config=configs/agr.py [--config.workdir=DIR --config.steps=N ...]

`--config` takes a path or the name of a packaged config (`agr.py`, `scr`, ...: `configs/`). The loop is
`rrc_jax.rl.trainer`; this module is its command line. A `ConfigError` (a setting or file to fix) is printed as
one line; anything else keeps its traceback.
"""

from __future__ import annotations

from rrc_jax import cli
from rrc_jax.rl.trainer import run

CONFIG = cli.config_flag("agr.py, scr.py, prc.py, drm.py")


def main(argv) -> None:
    settings = cli.settings_value(CONFIG, argv, "agr.py")

    cli.join_processes(settings)  # before anything touches a device
    cli.exit_on_user_error(run, settings)


if __name__ == "__main__":
    cli.start(main)
