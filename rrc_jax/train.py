"""GRPO with rewards from a generative reward model (RRC) or the DRM / PRC baselines: the main job.

    python -m rrc_jax.train --config=configs/agr.py [--config.workdir=DIR --config.steps=N ...]

`--config` takes a path or the name of a packaged config (`agr.py`, `scr`, ...: `configs/`). The loop is
`rrc_jax.rl.trainer`; this module is its command line. A `ConfigError` (a setting or file to fix) is printed as
one line; anything else keeps its traceback.
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

from rrc_jax.config import run_cli
from rrc_jax.errors import exit_on_user_error

CONFIG = config_flags.DEFINE_config_file("config", None, "Trainer config: a file or a packaged name (agr.py, "
                                         "scr.py, prc.py, drm.py).", lock_config=True)


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=agr.py")
    if not flags.FLAGS["verbosity"].present:  # Orbax logs every save at INFO; keep the terminal for progress
        logging.set_verbosity(logging.WARNING)
    from rrc_jax import distributed
    from rrc_jax.rl.trainer import run

    exit_on_user_error(distributed.initialize, CONFIG.value.distributed)  # before anything touches a device
    exit_on_user_error(run, CONFIG.value)


if __name__ == "__main__":
    run_cli(main)
