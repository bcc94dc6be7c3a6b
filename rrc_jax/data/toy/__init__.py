"""The toy world (docs/design.md, the toy world): a sorting task with a graded oracle quality, on which a tiny policy, a tiny
generative reward model and a tiny DRM are trained so that the whole system runs on a laptop CPU in minutes."""

from rrc_jax.data.toy.task import (ALPHABET, Annotator, SortTask, is_held_out, oracle_quality, parse_digits,
                                   toy_judgment)

__all__ = ["ALPHABET", "Annotator", "SortTask", "is_held_out", "oracle_quality", "parse_digits", "toy_judgment"]
