"""The planner's command line (the package docstring):

    python -m rrc_jax.plan --config=agr.py --topology=v5e-64 [--slices=2] [--config.models.policy=llama3-8b ...]
"""

from __future__ import annotations

from rrc_jax import cli
from rrc_jax.config import validate
from rrc_jax.plan.report import report


def _main(argv) -> None:
    config = cli.config_value(_CONFIG, argv, "agr.py")

    def run():
        print(report(validate(config), _TOPOLOGY.value, _SLICES.value))

    cli.exit_on_user_error(run)


if __name__ == "__main__":
    from absl import flags

    from rrc_jax import cli

    _CONFIG = cli.config_flag("agr.py, scr.py, prc.py, drm.py")
    _TOPOLOGY = flags.DEFINE_string("topology", "v5e-8", "v4-N, v5p-N (TensorCores), v5e-N, v6e-N (chips), h100-N, "
                                                         "h200-N (GPUs), cpu-N")
    _SLICES = flags.DEFINE_integer("slices", 1, "slices of --topology joined by the data-center network (the mesh "
                                                "across them: --config.mesh.dcn, default data parallel)")
    cli.start(_main)
