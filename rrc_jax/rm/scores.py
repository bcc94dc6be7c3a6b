"""A discriminative reward model's scores: the value head (Eq. 1's model) on `prompt + response`, rendered with the
DRM's *own* tokenizer and chat template (`rrc_jax.rm.examples.scored_ids`): a DRM need not share the policy's
vocabulary. The DRM reward (`rrc_jax.constructions.drm`), seeded tournaments and the reward-model evaluation
(`rrc_jax.rm.accuracy`) read it.

Shapes: K (prompt, response) pairs, T padded length.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from rrc_jax.errors import ConfigError
from rrc_jax.models import Decoder
from rrc_jax.models.batches import agreed_chunks, pad_sequences, round_up
from rrc_jax.rm.examples import scored_ids
from rrc_jax.sharding import host_row_multiple, host_rows, mesh_of, put_rows, use_mesh


@jax.jit
def _values(graphdef, state, ids, mask):
    return nnx.merge(graphdef, state).values(ids, mask)


class DRMScorer:
    """The value-head scores of a reward model (`model` with a value head, its `tokenizer`), `max_batch` sequences
    per call over the whole mesh."""

    def __init__(self, model: Decoder, tokenizer, max_batch: int = 256):
        if not model.cfg.value_head:
            raise ConfigError("the DRM has no value head (score.weight); give a reward model trained with Eq. 1")
        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch

    def scores(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        """Value-head scores `[K]` float32 of K (prompt, response) pairs. Collective on several hosts: each passes
        its own pairs."""
        rows = [scored_ids(self.tokenizer, p, o) for p, o in zip(prompts, responses)]
        pad = self.model.cfg.pad_token_id or 0
        mesh = mesh_of(self.model)
        graphdef, state = nnx.split(self.model)
        out = np.zeros(len(rows), np.float32)
        per_host = max(1, self.max_batch // jax.process_count())
        for chunk, n, t in agreed_chunks([len(r) for r in rows], per_host):  # collective on hosts
            n = round_up(n, host_row_multiple(mesh))
            ids, mask = put_rows(pad_sequences([rows[i] for i in chunk] + [[pad]] * (n - len(chunk)), t, pad,
                                               "right"), mesh)
            with use_mesh(mesh):  # the DRM's own layout (`mesh.drm`)
                out[chunk] = host_rows(_values(graphdef, state, ids, mask), mesh)[:len(chunk)]
        return out
