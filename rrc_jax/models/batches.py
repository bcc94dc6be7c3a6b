"""Padding token lists into fixed-shape batches: the length buckets every jitted step compiles for, the chunks every
host agrees on (`agreed_chunks`), and the completion batches (prompt + completion, loss on the completion) that
GRPO, SFT and the toy world train on.

Shapes: B rows, T padded length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rrc_jax import distributed

MIN_BUCKET = 16


def round_up(n: int, multiple: int) -> int:
    """`n` rounded up to a multiple of `multiple`."""
    return -(-int(n) // multiple) * multiple


def bucket_length(n: int, minimum: int = MIN_BUCKET) -> int:
    """The padded length used for `n` tokens: the next power of two, at least `minimum`."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


def length_bucket(n: int) -> int:
    """A finer padded length for n tokens: quarter steps of `bucket_length(n)` (at least 16), so padding wastes
    at most about a third while compilations stay at four per octave. 0 for n = 0."""
    b = bucket_length(n)
    return min(b, round_up(n, max(16, b // 4)))


def pad_sequences(seqs: Sequence[Sequence[int]], length: int, pad_id: int, side: str = "left"
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Token lists -> ids `[B, length]` int32 and mask `[B, length]` bool, padded on `side` ('left' | 'right')."""
    if side not in ("left", "right"):
        raise ValueError(f"side={side!r}: use 'left' or 'right'")
    ids = np.full((len(seqs), length), pad_id, np.int32)
    mask = np.zeros((len(seqs), length), bool)
    for i, s in enumerate(seqs):
        if len(s) > length:
            raise ValueError(f"sequence {i} has {len(s)} tokens, more than the padded length {length}")
        sl = slice(length - len(s), length) if side == "left" else slice(0, len(s))
        ids[i, sl] = np.asarray(s, np.int32)
        mask[i, sl] = True
    return ids, mask


def completion_batch(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int,
                     length: int | None = None) -> dict[str, np.ndarray]:
    """Right-padded `[prompt, completion]` rows: `ids [B, T]` int32, `mask [B, T]` (real tokens) and
    `loss_mask [B, T]` (the completion's tokens, whose log-likelihood is trained). T = `length`, by default the
    `length_bucket` of the longest row (few shapes, few compilations)."""
    rows = [list(p) + list(c) for p, c in zip(prompts, completions)]
    longest = max(map(len, rows), default=0)
    length = length_bucket(longest) if length is None else length
    if longest > length:
        i = next(i for i, r in enumerate(rows) if len(r) > length)
        raise ValueError(f"example {i} has {len(rows[i])} tokens, more than the padded length {length}")
    ids, mask = pad_sequences(rows, length, pad_id, "right")
    loss_mask = np.zeros_like(mask)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        loss_mask[i, len(p):len(p) + len(c)] = True
    return {"ids": ids, "mask": mask, "loss_mask": loss_mask}


def agreed_chunks(lengths: Sequence[int], per_host: int) -> list[tuple[list[int], int, int]]:
    """Items of the given token `lengths`, sorted by length and cut into chunks of at most `per_host`, as
    `(item indices, rows, padded length)` per chunk: rows and padded length (`length_bucket`) are the largest of
    every host's chunk of that index, and every host gets as many chunks as the host with the most (the extra ones
    without items)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunks = [order[start:start + per_host] for start in range(0, len(order), per_host)]
    plan = distributed.agree([(len(c), length_bucket(max(lengths[i] for i in c))) for c in chunks], 2)
    return [(chunks[k] if k < len(chunks) else [], n, t) for k, (n, t) in enumerate(plan)]
