"""Where every sampler comes from: `make_sampler(role, model, ...)` builds the Sampler of one role of a run (the
policy's rollout, the reference's anchors, the GRM's judge) with the engine named by `inference.engine`.

`ENGINES` maps an engine's name to its constructor `(model, tokenizer, *, role, **options) -> Sampler`; today only `jax`
(`rrc_jax.inference.engine.JaxSampler`, whose options are `max_batch`, `prefix_reuse`, `stop_token_ids` and
`pad_id`). Another engine is one adapter and one line here. Callers never construct an engine themselves. The role
is what a sampler is built for: it names the sampler in errors and stats, and it is where a role's own inference
layout attaches (docs/design.md, section 2, "Samplers, one per role").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

from rrc_jax.errors import ConfigError
from rrc_jax.inference.engine import JaxSampler
from rrc_jax.inference.sampler import Sampler
from rrc_jax.rl.roles import ROLES

ENGINES: dict[str, Callable[..., Sampler]] = {"jax": JaxSampler}


@dataclasses.dataclass(frozen=True)
class InferenceConfig:
    """The inference engine every sampler of a run is built with (`inference`)."""

    GROUP: ClassVar[str] = "inference"
    engine: str = "jax"

    def __post_init__(self):
        check_engine(self.engine)


def check_engine(engine: str) -> None:
    """A one-line `ConfigError` for an engine name `ENGINES` does not know."""
    if engine not in ENGINES:
        raise ConfigError(f"config.inference.engine: {engine!r} is not an inference engine; known: "
                          f"{', '.join(ENGINES)}")


def make_sampler(role: str, model, tokenizer=None, *, engine: str = "jax", **options) -> Sampler:
    """The Sampler of `role` (one of `rrc_jax.rl.roles.ROLES`) on `model` and its `tokenizer` (the stop tokens,
    the pad id), built by `engine` with the engine's `options` (e.g. `max_batch`, the most rows per model call)."""
    if role not in ROLES:
        raise ValueError(f"make_sampler: unknown role {role!r}; roles are {', '.join(ROLES)}")
    check_engine(engine)
    return ENGINES[engine](model, tokenizer, role=role, **options)
