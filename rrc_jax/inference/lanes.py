"""Continuous batching of `JaxSampler.complete`: decoding lanes that take the next waiting question when their
judgment ends, instead of chunks that decode until their longest judgment ends.

A call's questions are grouped by their prefix (the judge's `[instruction, prompt]`), a question's copies (votes)
together. The lanes are P groups of M rows; group p continues prefix slot p, a shared level of the cache
(`KVCache.branch`: read once per step for its M lanes), and each lane holds the rest of its question (its first
response, second response and the question's end) and its judgment in slots of its own, written at a cursor of its
own (`KVCache.lanes`). The decode loop (`kernels.decode_rows`) returns when `refill_at` of the lanes that have work
waiting are done; the host reads the finished judgments and gives each free lane the next question of its group's
prompt (`_refill`: the new questions prefilled together in a batch of `refill` rows that reads the lanes' prefixes,
then placed in the lanes' rows; a group keeps its last prefilled question in a pool row, so that its later votes
copy it rather than prefill it again) and, once a group's prompt has no question left and its lanes are free, puts
the next prompt in its slot (`put_prefix`). The loop then goes on, so rows idle only while fewer than `refill_at`
lanes wait, and at the end.

A question draws from its own stream (`streams[q]`), its t-th token with `fold_in(stream key, t)`, as in a chunk
(`kernels._decode`): its judgment is a function of its tokens, the key and its stream, whichever lane takes it and
whenever. One process; prefix reuse beyond the prompt (a first response shown before several questions) is not
kept: each lane prefills its question below the prompt.

Shapes: Q questions, P prefix slots, M lanes a slot, R = P x M lanes, T question tokens below the prompt (padded),
N new tokens.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rrc_jax.inference.kernels import PREFILL_CHUNK, Run, decode_rows, new_run, prefill, row_keys, run_output
from rrc_jax.inference.sampler import SampleOutput, SamplingParams, Suffix
from rrc_jax.models.batches import length_bucket, pad_sequences, round_up
from rrc_jax.models.kv_cache import ATTENTION_BLOCK, KVCache, OwnRows, fresh_rows, own_rows, put_prefix, put_rows_of
from rrc_jax.sharding import host_rows, put_rows

REFILL_FRACTION = 8  # a segment of decoding ends once 1/8 of the lanes with work waiting are free


class LanePlan(NamedTuple):
    """The lanes of a call: `slots` prefix slots (P) of `lanes` rows each (M), prefixes padded to `prefix` slots,
    questions below them to `question` tokens, each lane `own` slots (its question and its judgment); decoding
    stops for refills once `refill_at` lanes wait, which are prefilled `refill` rows at a time."""

    slots: int
    lanes: int
    prefix: int
    question: int
    own: int
    refill_at: int
    refill: int

    @property
    def rows(self) -> int:
        return self.slots * self.lanes


def lane_plan(prefix_lengths: Sequence[int], questions: Sequence[int], question_length: int, n: int, max_rows: int,
              max_slots: int | None = None) -> LanePlan:
    """The `LanePlan` of a call: `prefix_lengths` of its prompts (one prefix each), `questions` each asks, its
    questions' longest tokens below the prompt, `n` new tokens; at most `max_rows` lanes and `max_slots` cache
    slots (the lanes' own, the pool's row a group keeps its last question in, and the prefixes',
    `JaxSampler.max_batch_tokens`; None: rows alone bound it). A slot per prompt while they fit, its lanes the rows
    shared out (no more than a prompt has questions)."""
    prefix, question = length_bucket(max(prefix_lengths)), length_bucket(question_length)
    own = round_up(question + n, ATTENTION_BLOCK)
    slots = min(len(prefix_lengths), max_rows)
    lanes = max(1, min(max_rows // slots, max(questions)))
    while max_slots is not None and (lanes + 1) * slots * own + slots * prefix > max_slots and lanes * slots > 1:
        lanes, slots = (lanes - 1, slots) if lanes > 1 else (lanes, slots - 1)
    rows = slots * lanes
    refill_at = -(-rows // REFILL_FRACTION)
    return LanePlan(slots, lanes, prefix, question, own, refill_at, min(rows, round_up(refill_at, 8)))


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2, 3))
def _refill(graphdef, state, cache: KVCache, pool: OwnRows, ids, mask, slots, keep, lanes, source, prefix_logits
            ) -> tuple[KVCache, OwnRows]:
    """`cache`'s lanes `lanes [m]` (an index >= R: none) given their questions: `source [m]`, each lane's, an index
    into the `pool`'s P rows (a question prefilled before, kept for its later copies) then the k questions
    prefilled here, `ids [k, T]` (right-padded, real where `mask`) after their groups' prefixes `slots [k]`, each
    reading its prefix where the lanes keep it (one shared level); they are kept in the pool's rows `keep [k]`
    (P: not kept). Returns the cache and the pool. `prefix_logits [P, V]`: the next-token logits after each
    prefix (those of a question with no tokens of its own)."""
    model = nnx.merge(graphdef, state)
    take = lambda x, axis: jnp.take(x, slots, axis=axis)
    prefix_tokens = cache.shared_mask[0].sum(axis=(0, 2), dtype=jnp.int32)  # [P] each prefix's real tokens
    rows = fresh_rows(cache, ids.shape[0]).replace(
        shared_k=(take(cache.shared_k[0], 2),), shared_v=(take(cache.shared_v[0], 2),),
        shared_mask=(take(cache.shared_mask[0], 1),), positions=take(prefix_tokens, 0),
        logits=take(prefix_logits, 0))
    for start in range(0, ids.shape[1], PREFILL_CHUNK):
        rows = model.extend(rows, ids[:, start:start + PREFILL_CHUNK], mask[:, start:start + PREFILL_CHUNK])
    new = own_rows(rows, mask.sum(axis=1, dtype=jnp.int32))
    return put_rows_of(cache, lanes, pool.concat(new).take(source)), pool.put(keep, new)


@jax.jit
def _empty_pool(cache: KVCache) -> OwnRows:
    n = cache.shared_mask[0].shape[1]
    return own_rows(fresh_rows(cache, n), jnp.zeros((n,), jnp.int32))


@functools.partial(jax.jit, donate_argnums=(0,))
def _put_prefix(cache: KVCache, one: KVCache, slot) -> KVCache:
    return put_prefix(cache, one, slot)


def prompt_queues(suffixes: Sequence[Suffix]) -> dict[int, collections.deque]:
    """Each prompt's questions (indices), in the order first asked, a question's copies (votes: the same tokens)
    together, so that a lane group prefills a question once for all of them (`_refill`'s pool)."""
    order: dict[int, dict[tuple, list[int]]] = {}
    for i, (owner, tokens) in enumerate(suffixes):
        order.setdefault(owner, {}).setdefault(tuple(tokens), []).append(i)
    return {o: collections.deque(i for copies in texts.values() for i in copies) for o, texts in order.items()}


def complete(sampler, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix], params: SamplingParams,
             key: jax.Array, streams: np.ndarray) -> SampleOutput:
    """`JaxSampler.complete` in lanes (module docstring): one continuation per question `(prefix index, suffix)`,
    question q drawing from stream `streams[q]` of `key`; updates `sampler.stats`."""
    model, pad, n, q, stats = sampler.model, sampler.pad_id, params.max_new_tokens, len(suffixes), sampler.stats
    queues = prompt_queues(suffixes)
    owners = collections.deque(queues)
    plan = lane_plan([len(prefixes[o]) for o in owners], [len(x) for x in queues.values()],
                     max(len(s) for _, s in suffixes), n, sampler.host_batch, sampler.max_batch_tokens)
    r, m, p, mesh = plan.rows, plan.lanes, plan.slots, sampler.mesh
    keys = row_keys(key, streams)  # [Q, ...] each question's stream
    slot_owner = [owners.popleft() for _ in range(min(p, len(owners)))]
    heads = [list(prefixes[o]) for o in slot_owner] + [[pad]] * (p - len(slot_owner))
    cache = prefill(model, *pad_sequences(heads, plan.prefix, pad, "left"), cache_size=plan.prefix, ring=False)
    prefix_logits = cache.logits
    cache = cache.branch(m, size=plan.own).as_lanes()
    pool, pooled = _empty_pool(cache), [None] * p  # each group's last question prefilled, for its copies
    calls, prefilled = 1, sum(len(prefixes[o]) for o in slot_owner)
    out = SampleOutput(np.full((q, n), pad, np.int32), np.zeros((q, n), np.float32), np.zeros(q, np.int32),
                       np.zeros(q, bool))
    lane_question = np.full(r, -1)
    run = new_run(np.zeros(r, bool), n, pad)  # every lane free
    lane_keys = np.zeros((r, *keys.shape[1:]), keys.dtype)
    graphdef, state = nnx.split(model)
    asked = lambda i: (suffixes[i][0], tuple(suffixes[i][1]))  # noqa: E731 - a question's text: its copies share it
    while True:
        ended = np.flatnonzero(run.done & (lane_question >= 0))  # finished judgments
        for mine, theirs in zip(out, run_output(run)):
            mine[lane_question[ended]] = theirs[ended]
        lane_question[ended] = -1
        for slot, owner in enumerate(slot_owner):  # a group done with its prompt takes the next
            if owners and (owner < 0 or not queues[owner]) and (lane_question[slot * m:(slot + 1) * m] < 0).all():
                slot_owner[slot] = owner = owners.popleft()
                one = prefill(model, *pad_sequences([prefixes[owner]], plan.prefix, pad, "left"),
                              cache_size=plan.prefix, ring=False)
                cache = _put_prefix(cache, one, jnp.int32(slot))
                prefix_logits = prefix_logits.at[slot].set(one.logits[0])
                pooled[slot] = None
                calls, prefilled = calls + 1, prefilled + len(prefixes[owner])
        taken = [(b, queues[slot_owner[b // m]].popleft()) for b in np.flatnonzero(lane_question < 0)
                 if slot_owner[b // m] >= 0 and queues[slot_owner[b // m]]]
        if not taken and (lane_question < 0).all():
            break
        for start in range(0, len(taken), plan.refill):  # the new questions into their lanes
            part = taken[start:start + plan.refill]
            new: dict[tuple, int] = {}  # a question prefilled in this refill -> its row
            source, slots, keep = [], [], []
            for b, i in part:
                slot = b // m
                if asked(i) not in new and pooled[slot] != asked(i):
                    new[asked(i)] = len(slots)
                    slots.append(slot)
                source.append(p + new[asked(i)] if asked(i) in new else slot)
            texts = list(new)  # the questions prefilled, in their rows' order
            for row, slot in enumerate(slots):  # each group keeps its last new question for its copies
                keep.append(slot if slot not in slots[row + 1:] else p)
                if keep[-1] < p:
                    pooled[slot] = texts[row]
            rows = [list(text) for _, text in texts]
            fill = lambda x, v: np.asarray(x + [v] * (plan.refill - len(x)))  # noqa: E731
            ids, mask = pad_sequences(rows + [[]] * (plan.refill - len(rows)), plan.question, pad, "right")
            cache, pool = _refill(graphdef, state, cache, pool, *put_rows((ids, mask), mesh), jnp.asarray(fill(slots, 0)),
                                  jnp.asarray(fill(keep, p)), jnp.asarray(fill([b for b, _ in part], r)),
                                  jnp.asarray(fill(source, 0)), prefix_logits)
            calls, prefilled = calls + 1, prefilled + int(mask.sum())
        run = Run(*(np.array(x) for x in run))
        for b, i in taken:
            lane_question[b], lane_keys[b] = i, keys[i]
            run.tokens[b], run.logprobs[b], run.lengths[b], run.stopped[b], run.done[b] = pad, 0, 0, False, False
        # the lanes whose end can be refilled: busy now, their prompt's questions or another prompt waiting
        waiting = (lane_question >= 0) & np.asarray([bool(owners) or bool(queues[slot_owner[b // m]])
                                                     if slot_owner[b // m] >= 0 else False for b in range(r)])
        run, cache, steps = decode_rows(model, cache, put_rows(run, mesh), put_rows(lane_keys, mesh), params,
                                        pad_id=pad, impl=str(jax.random.key_impl(key)),
                                        waiting=put_rows(waiting, mesh), refill_at=plan.refill_at)
        run = Run(*(host_rows(x, mesh) for x in run))
        stats.decode_row_steps += r * int(steps)
    stats.calls += calls
    stats.generated_tokens += int(out.lengths.sum())
    stats.prefill_tokens += prefilled
    stats.prefill_tokens_saved += sum(len(prefixes[o]) + len(s) for o, s in suffixes) - prefilled
    return out
