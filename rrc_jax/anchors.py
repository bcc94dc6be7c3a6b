"""(Re)generate AGR anchors with the reference policy: the command line of `rrc_jax.rl.anchor_store`.

    python -m rrc_jax.anchors --config=agr.py [--config.reward.agr.n_anchors=8]

Writes `reward.agr.anchors_path` (default `workdir/anchors.jsonl`), one line per training prompt:
`{"id", "prompt", "anchors": [...]}`. The trainer generates the file itself when it is missing; this command
remakes it (e.g. with more anchors, or after changing the reference policy).
"""

from __future__ import annotations

import jax

from rrc_jax import cli
from rrc_jax.constructions.agr import anchor_store
from rrc_jax.inference import role_sampler
from rrc_jax.rl.roles import Roles
from rrc_jax.rl.trainer import training_prompts

CONFIG = cli.config_flag("agr.py")


def remake(settings) -> None:
    """Generate the anchors of a trainer's `settings` with its reference policy, over its mesh."""
    mesh = settings.mesh.make()
    with jax.set_mesh(mesh):
        roles = Roles.of_run(settings, mesh)
        train, _ = training_prompts(settings, roles)
        reference = role_sampler(roles, "reference", engine=settings.inference)
        anchor_store(settings, train, roles.tokenizer("policy")).generate(reference, settings.seed)


def main(argv) -> None:
    settings = cli.settings_value(CONFIG, argv, "agr.py")
    cli.join_processes(settings)
    cli.exit_on_user_error(remake, settings)


if __name__ == "__main__":
    cli.start(main)
