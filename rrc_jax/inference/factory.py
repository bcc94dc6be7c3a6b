"""Where every sampler comes from: `make_sampler` builds the Sampler of an inference engine (`inference.engine`).

`ENGINES` maps an engine's name to its constructor `(model, tokenizer, **options) -> Sampler`; today only `jax`
(`rrc_jax.inference.engine.JaxSampler`, whose options are `max_batch`, `prefix_reuse`, `stop_token_ids` and
`pad_id`). Another engine is one adapter and one line here. Callers never construct an engine themselves.
"""

from __future__ import annotations

from collections.abc import Callable

from rrc_jax.errors import ConfigError
from rrc_jax.inference.engine import JaxSampler
from rrc_jax.inference.sampler import Sampler

ENGINES: dict[str, Callable[..., Sampler]] = {"jax": JaxSampler}


def check_engine(engine: str) -> None:
    """A one-line `ConfigError` for an engine name `ENGINES` does not know."""
    if engine not in ENGINES:
        raise ConfigError(f"config.inference.engine: {engine!r} is not an inference engine; known: "
                          f"{', '.join(ENGINES)}")


def make_sampler(model, tokenizer=None, *, engine: str = "jax", **options) -> Sampler:
    """The Sampler of `engine` on `model` (and its `tokenizer`, for the stop tokens and the pad id), with the
    engine's `options` (e.g. `max_batch`, the most rows per model call)."""
    check_engine(engine)
    return ENGINES[engine](model, tokenizer, **options)
