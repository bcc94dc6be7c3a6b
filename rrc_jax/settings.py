"""Typed component configs: each component's settings are a frozen dataclass beside the code that reads them.

Its fields are the config fields the component reads, with their defaults (the defaults `rrc_jax.config` builds
the command line's `ConfigDict` from); its `__post_init__` checks them, naming `config.<GROUP>.<field>` and the fix.
`rrc_jax.config.parse(cls, config)` builds it once, at validation, from the group `cls.GROUP` (a dotted path: `rl`,
`reward.judge`), which may hold other components' fields too (`rl` holds the rollout's, the learner's, the GRPO
objective's and the guard's); below the command line code receives these dataclasses, never the `ConfigDict`.
ml_collections stays the command-line format: the files and the dotted names users type do not change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import ml_collections

from rrc_jax.errors import ConfigError


def unset(kind: type):
    """A dataclass field that is None until the user sets it (`defaults` makes it an ml_collections placeholder of
    type `kind`, which the command line can set): the component then chooses, e.g. from another field."""
    return dataclasses.field(default=None, metadata={"unset": kind})


def not_in_config(default):
    """A dataclass field the config group does not hold: the code sets it (e.g. a judge's `seed`, the run's)."""
    return dataclasses.field(default=default, metadata={"config": False})


def config_fields(cls) -> list[dataclasses.Field]:
    """The fields of `cls` its config group holds (all but `not_in_config` ones), in order."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("config", True)]


def defaults(*classes) -> dict:
    """The default fields of one config group made of `classes`, in order (an `unset` field as a placeholder)."""
    out: dict = {}
    for cls in classes:
        for f in config_fields(cls):
            kind = f.metadata.get("unset")
            out[f.name] = ml_collections.config_dict.placeholder(kind) if kind else getattr(cls(), f.name)
    return out


def field_error(group: str, field: str, message: str) -> ConfigError:
    """The error of a bad `config.<group>.<field>`."""
    return ConfigError(f"config.{group}.{field}: {message}")


def one_of(group: str, field: str, value, allowed: Sequence) -> None:
    """A `ConfigError` unless `value` is one of `allowed`."""
    if value not in allowed:
        raise field_error(group, field, f"{value!r}: use {', '.join(map(repr, allowed))}")


def at_least(group: str, field: str, value, least, why: str = "") -> None:
    """A `ConfigError` unless `value >= least` (NaN fails)."""
    if not value >= least:
        raise field_error(group, field, f"{value} must be >= {least}" + (f" ({why})" if why else ""))


def flat_fields(tree: Mapping, prefix: str = "") -> dict:
    """`{"group.field": value}` of every leaf of a config as a JSON dict (`rrc_jax.config.config_record`)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(flat_fields(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
