"""The JAX inference engine: the Sampler protocol (`rrc_jax.inference.sampler`) on a `Decoder`.

`generate` samples GRPO groups: each prompt is prefilled once and its G rows continue it (`KVCache.branch`).

`complete` and `next_token_logprobs` answer questions `(prefix index, suffix ids)`. With `prefix_reuse` (default)
they are read as a prefix tree (`question_tree`): prefix, then the first `splits[q]` suffix tokens other
questions of the prefix share (a judge question's first response), then the rest of the question, then its
copies (the same question asked again: a pair's votes in one order). Each chunk prefills its P prefixes
(left-padded, one call), branches from them (`KVCache.branch`: shared, not copied; each row attends to its
ancestors, each read once per step for the rows under it), appends the next level's right-padded tokens (`extend`,
`PREFILL_CHUNK` tokens at a time), branches again, and at last decodes or reads the next-token logits; rows
without a question are padding and dropped. Every level is prefilled once for all the questions under it in a
chunk (a part of the tree cut off to fit the call's shape prefills its shared tokens again): what the questions
would have prefilled on their own beyond that is `stats.prefill_tokens_saved`. Without reuse every
question is prefilled in full, in chunks of `max_batch` (rows padded to multiples of 8). Lengths are padded to
`length_bucket`s (the longest of the call at each level), and every chunk of a call has one shape, the one of least
padded work (`question_tree.call_shape`), so that a run compiles few shapes (a server's sampler, `reuse_shapes`,
pads a call further, to a shape it has compiled). A chunk never
gathers rows of another chunk, so its rows stay where they are on the mesh.

A question draws from its own stream of the call's key (`kernels.row_keys`): the caller's `streams[q]` (default q).
Its continuation therefore depends on its text, the key and its stream only, not on the batch, the chunking,
`max_batch` or the questions asked beside it: the judge asks a pair's later votes in another call (early-stopped
voting) and gets the draws full voting gets. A rollout chunk draws with one key for its rows (`fold_in(rng, c)`).

On several hosts (`rrc_jax.distributed`) every call is collective and every host passes its own prompts or
questions: `max_batch` counts the rows of a call over the whole mesh, each host fills `max_batch // hosts` of them,
the hosts agree on each chunk's shape (`distributed.agree`: the largest of their counts and lengths), a host with
fewer chunks runs padding chunks, and each host gets back only its own rows (`sharding.put_rows` / `host_rows`).

With a `layout` (the trainer passes the inference layout for the rollout) the sampler decodes from its own copy of
the model in that layout (`rollout_copy.RolloutCopy`: bf16 where the run computes in bf16, tensor-parallel, no weight
gathered in the decode loop), which `update_weights` refreshes after every optimizer step; without one, or on one
device, it decodes from the model it is given (the learner's own object: every update is seen at once). Every call
runs on the mesh of the model it decodes from (`sharding.use_mesh`), so activations are placed for that layout.

Shapes: Q questions, P prefixes, R rows of a chunk, N new tokens, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rrc_jax import distributed
from rrc_jax.inference import lanes, question_tree
from rrc_jax.inference.kernels import decode, extend, generate, prefill
from rrc_jax.inference.rollout_copy import RolloutCopy
from rrc_jax.inference.sampler import SampleOutput, SamplerStats, SamplingParams, Suffix
from rrc_jax.models import stop_tokens
from rrc_jax.models.batches import agreed_chunks, length_bucket, pad_sequences, round_up
from rrc_jax.models.decoder import Decoder
from rrc_jax.models.kv_cache import ATTENTION_BLOCK, KVCache
from rrc_jax.sharding import Layout, host_row_multiple, host_rows, mesh_of, use_mesh


def _on_model_mesh(method):
    """A sampler call run on the mesh of the model it decodes from (`use_mesh`)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with use_mesh(self.mesh):
            return method(self, *args, **kwargs)
    return call


class JaxSampler:
    """The Sampler protocol on a `Decoder`.

    Args:
      model: the decoder (held, not copied: parameter updates applied to it are seen by the next call).
      tokenizer: its tokenizer (`tokenizer`); its EOS id is added to the model's stop tokens.
      max_batch: most rows per model call (a chunk), over the whole mesh.
      max_batch_tokens: with `complete`, most cache slots of a chunk's questions' own tokens and their rows'
        decoding room, over the whole mesh (`question_tree.chunk_slots`): long questions with long answers (a
        reasoning judge's) run in fewer rows a call; None: `max_batch` alone.
      prefix_reuse: prefill a shared prefix once for all its questions (see the module docstring).
      stop_token_ids: ids that end a continuation when `SamplingParams.stop_token_ids` is None (default: the
        model's EOS ids and the tokenizer's, `stop_tokens`).
      pad_id: id written after a row ends (default: the model's pad id, else the tokenizer's, else 0).
      role: the role it samples for (`rrc_jax.sharding.ROLES`; `make_sampler` sets it).
      layout: decode from a copy of `model` in this layout (module docstring), its parameters in the model's
        compute dtype; None, or a layout of one device: decode from `model` itself.
      reuse_shapes: run a call's questions in chunk shapes an earlier call compiled (padding rows and slots, the
        tree's parts cut to fit, `_reuse`) rather than compiling shapes of their own: for a server, whose batches of
        unrelated requests take ever new shapes. Decoding reads the weights once a step whatever the rows, so
        padding costs little; a new compilation costs seconds (minutes for a large model on a pod). One process.
      continuous: `complete` decodes in lanes that take the next waiting question when a judgment ends
        (`rrc_jax.inference.lanes`) rather than in chunks that decode until their longest judgment ends; the same
        continuations. One process.
    """

    def __init__(self, model: Decoder, tokenizer=None, *, max_batch: int = 256, prefix_reuse: bool = True,
                 stop_token_ids: Sequence[int] | None = None, pad_id: int | None = None, role: str = "policy",
                 layout: Layout | None = None, reuse_shapes: bool = False, max_batch_tokens: int | None = None,
                 continuous: bool = False):
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch} must be >= 1")
        if max_batch_tokens is not None and max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens={max_batch_tokens} must be >= 1 (or None: rows alone bound a call)")
        self.max_batch_tokens = max_batch_tokens
        if continuous and jax.process_count() > 1:
            raise ValueError("continuous=True: continuous batching runs in one process; on several hosts leave it "
                             "off (the judge decodes in chunks)")
        self.continuous = continuous
        if reuse_shapes and jax.process_count() > 1:
            raise ValueError("reuse_shapes: one process only (the hosts would have to agree on the shapes they keep)")
        self.copy = RolloutCopy(model, layout, model.cfg.dtype) if layout is not None and layout.devices > 1 else None
        self.model = self.copy.model if self.copy is not None else model
        self.tokenizer, self.role = tokenizer, role
        self.max_batch = int(max_batch)
        self.prefix_reuse = prefix_reuse
        self.reuse_shapes = reuse_shapes
        self._shapes: dict[int, set[tuple[int, ...]]] = {}  # the chunk shapes run, by the room decoded after them
        self.stop_token_ids = (tuple(int(t) for t in stop_token_ids) if stop_token_ids is not None
                               else stop_tokens(model.cfg.eos_token_ids, tokenizer))
        if pad_id is None:
            pad_id = model.cfg.pad_token_id if model.cfg.pad_token_id is not None else getattr(
                tokenizer, "pad_token_id", None)
        self.pad_id = int(pad_id or 0)
        self.stats = SamplerStats()
        self.mesh = mesh_of(self.model)

    @property
    def context_length(self) -> int:
        """The most tokens (prompt plus continuation) the model's positions hold."""
        return int(self.model.cfg.max_position_embeddings)

    def update_weights(self, params) -> int:
        """Take the policy's new `params` (an `nnx.State` of its `nnx.Param`s): resharded into the own copy when
        there is one (returns the bytes per device it moved), else the held model pointed at them (nothing moves
        when they are its own, as when the learner updates the same model object in place; returns 0)."""
        if self.copy is not None:
            return self.copy.sync(params)

        nnx.update(self.model, params)
        return 0

    @property
    def host_batch(self) -> int:
        """Most rows this host puts in one call: `max_batch` over the hosts."""
        return max(1, self.max_batch // jax.process_count())

    def _params(self, params: SamplingParams) -> SamplingParams:
        if params.stop_token_ids is not None:
            return params
        return dataclasses.replace(params, stop_token_ids=self.stop_token_ids)

    def _rows(self, n: int) -> int:
        """This host's rows of a chunk of n questions: n rounded up to a multiple of 8 (at most max_batch) on one
        process, to `host_row_multiple` on several."""
        if jax.process_count() > 1:
            return round_up(max(n, 1), host_row_multiple(self.mesh))
        return min(self.max_batch, round_up(n, 8))

    # -- generate ---------------------------------------------------------------------------------------

    @staticmethod
    def _call_key(rng: jax.Array | int, local: bool = True) -> jax.Array:
        """The key of a call: `rng`'s (a key made on another mesh, e.g. the trainer's, is taken by value); with
        `local`, this host's own on several (its questions' streams are not another host's)."""
        key = jax.random.key(rng) if isinstance(rng, int) else jax.random.wrap_key_data(
            np.asarray(jax.random.key_data(rng)), impl=jax.random.key_impl(rng))
        return jax.random.fold_in(key, jax.process_index()) if local and jax.process_count() > 1 else key

    @_on_model_mesh
    def generate(self, prompt_ids: Sequence[Sequence[int]], group_size: int = 1,
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0) -> SampleOutput:
        """`group_size` continuations of each prompt: `SampleOutput` of `[B * G]` rows, prompt b's at
        `b*G ... b*G + G - 1`. Chunks hold whole groups, at most `max_batch` rows (at least one group), chunk c
        drawing with `fold_in(rng, c)`. On several hosts, B is this host's prompts (any number, zero included, as
        long as some host has one)."""
        params = self._params(params)
        per_chunk = max(1, self.host_batch // group_size)
        most = int(distributed.host_max(len(prompt_ids)))  # every host runs the chunks of the longest list
        if most == 0:
            raise ValueError("generate() got no prompts")
        outs = []
        for c, start in enumerate(range(0, most, per_chunk)):
            chunk = [list(p) for p in prompt_ids[start:start + per_chunk]]
            real = len(chunk)
            size = round_up(min(per_chunk, most - start), host_row_multiple(self.mesh))  # the same on every host
            chunk += [[self.pad_id]] * (size - real)  # padding prompts: a host with fewer prompts
            out = generate(self.model, chunk, params, rng=jax.random.fold_in(self._call_key(rng, local=False), c),
                           pad_id=self.pad_id, group_size=group_size, live=np.arange(size) < real)
            out = SampleOutput(*(x[:real * group_size] for x in out))
            self.stats.calls += 1
            self.stats.prefill_tokens += sum(map(len, chunk[:real]))
            self.stats.generated_tokens += int(out.lengths.sum())
            outs.append(out)
        return SampleOutput(*(np.concatenate(x) for x in zip(*outs)))

    # -- questions after shared prefixes ----------------------------------------------------------------

    @_on_model_mesh
    def complete(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix],
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0, *,
                 streams: Sequence[int] | None = None, splits: Sequence[int] | None = None) -> SampleOutput:
        """One continuation of `prefixes[i] + suffix` per question `(i, suffix)`: `SampleOutput` of `[Q]` rows,
        question q drawing from stream `streams[q]` of `rng` (default q); `splits[q]`: the leading tokens of its
        suffix other questions of its prefix share (the sampler protocol)."""
        params, key = self._params(params), self._call_key(rng)
        if params.temperature == 0 and len({(o, tuple(s)) for o, s in suffixes}) < len(suffixes):
            return self._greedy_once(prefixes, suffixes, params, key, splits)
        streams = np.arange(len(suffixes)) if streams is None else np.asarray(streams, np.int64)
        if self.continuous:
            self._check_prefixes(prefixes, suffixes)
            return lanes.complete(self, prefixes, suffixes, params, key, streams)
        n, q = params.max_new_tokens, len(suffixes)
        tokens = np.full((q, n), self.pad_id, np.int32)
        logprobs = np.zeros((q, n), np.float32)
        lengths = np.zeros(q, np.int32)
        truncated = np.zeros(q, bool)
        for chunk, rows, cache in self._caches(prefixes, suffixes, n, splits):
            row_streams = np.zeros(cache.batch_size // jax.process_count(), np.int64)  # padding rows: stream 0
            row_streams[rows] = streams[chunk]
            live = np.zeros(len(row_streams), bool)
            live[rows] = True
            out = decode(self.model, cache, params, rng=key, streams=row_streams, pad_id=self.pad_id, live=live)
            tokens[chunk], logprobs[chunk] = out.tokens[rows], out.logprobs[rows]
            lengths[chunk], truncated[chunk] = out.lengths[rows], out.truncated[rows]
            self.stats.generated_tokens += int(out.lengths[rows].sum())
            # the decode loop runs until its last active row stops: as many steps as the longest row's length
            self.stats.decode_row_steps += int(out.lengths.size) * int(out.lengths.max(initial=0))
        return SampleOutput(tokens, logprobs, lengths, truncated)

    def _greedy_once(self, prefixes, suffixes, params, key, splits) -> SampleOutput:
        """`complete` at temperature 0 with each different question decoded once: a question asked again (a
        pair's votes in one order) answers the same, so its rows are copies of the first asking's."""
        first: dict[tuple, int] = {}
        asking = [first.setdefault((o, tuple(s)), q) for q, (o, s) in enumerate(suffixes)]
        unique = sorted(first.values())
        out = self.complete(prefixes, [suffixes[q] for q in unique], params, key,
                            splits=None if splits is None else [splits[q] for q in unique])
        again = set(range(len(suffixes))) - set(unique)
        self.stats.prefill_tokens_saved += sum(len(prefixes[suffixes[q][0]]) + len(suffixes[q][1]) for q in again)
        at = np.searchsorted(unique, asking)
        return SampleOutput(*(x[at] for x in out))

    @_on_model_mesh
    def next_token_logprobs(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix],
                            token_ids: Sequence[int], *, splits: Sequence[int] | None = None) -> np.ndarray:
        """`log_softmax(logits)[token_ids]` `[Q, len(token_ids)]` float32 at the position after each question."""
        ids = jnp.asarray(token_ids, jnp.int32)
        out = np.zeros((len(suffixes), len(token_ids)), np.float32)
        for chunk, rows, cache in self._caches(prefixes, suffixes, 0, splits):
            out[chunk] = host_rows(jax.nn.log_softmax(cache.logits, axis=-1)[:, ids], self.mesh)[rows]
        return out

    def _caches(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix], extra: int,
                splits: Sequence[int] | None) -> Iterator[tuple[list[int], np.ndarray, KVCache]]:
        """(question indices of a chunk, the cache row of each, the chunk's cache with room for `extra` more
        tokens); the other rows of the cache are padding."""
        self._check_prefixes(prefixes, suffixes)
        if self.prefix_reuse:
            yield from self._tree_caches(prefixes, suffixes, extra, splits)
            return
        full = [list(prefixes[o]) + list(s) for o, s in suffixes]
        for chunk, n, t in agreed_chunks([len(f) for f in full], self.host_batch):
            rows = [full[i] for i in chunk] + [[self.pad_id]] * (self._rows(n) - len(chunk))
            ids, mask = pad_sequences(rows, t, self.pad_id, "left")
            self.stats.calls += 1
            self.stats.prefill_tokens += sum(len(full[i]) for i in chunk)
            yield chunk, np.arange(len(chunk)), prefill(self.model, ids, mask,
                                                        cache_size=round_up(t + max(extra, 1), ATTENTION_BLOCK))

    @staticmethod
    def _check_prefixes(prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix]) -> None:
        for i, (owner, _) in enumerate(suffixes):
            if not 0 <= owner < len(prefixes) or not prefixes[owner]:
                raise ValueError(f"question {i}: prefix index {owner} is out of range or its prefix is empty (every "
                                 "question needs at least one prefix token, e.g. BOS)")

    def _reuse(self, parts: list[question_tree.Piece], shape: tuple[int, ...], n: int, extra: int
               ) -> tuple[list[list[question_tree.Piece]], list[tuple]]:
        """`reuse_shapes`: the call's chunks and their shapes `(P, F, S, C, prefix, node, leaf lengths)` in a shape
        compiled before when one holds them in at most twice the chunks of the call's own `n` chunks of `shape` and
        at most twice its rows or its tokens (the parts cut to its F, S, C: `question_tree.uniform_chunks`), the
        one that runs the fewest tokens (`question_tree.chunk_cost`, the measure the call's own shape is chosen
        by: the fewest rows would pick a flat shape that prefills every question whole); else in the smallest
        compiled shape that holds `shape`, or `shape` itself (then remembered). Level lengths are the longest run
        so far."""
        seen = self._shapes.setdefault(extra, set())
        lengths = tuple(max(x[i] for x in (*seen, shape)) for i in (4, 5, 6))  # only grow: fewer shapes
        shape = (*shape[:4], *lengths)
        rows, tokens = n * math.prod(shape[:4]), n * question_tree.chunk_cost(shape, extra, self.host_batch)
        best = None
        for old in sorted(seen):
            if any(a < b for a, b in zip(old[4:], lengths)):
                continue
            chunks = question_tree.uniform_chunks(parts, old)
            cost = len(chunks) * question_tree.chunk_cost(old, extra, self.host_batch)
            near = len(chunks) * math.prod(old[:4]) <= 2 * rows or cost <= 2 * tokens
            if near and len(chunks) <= 2 * n and (best is None or cost < best[0]):
                best = (cost, chunks, old)
        if best is not None:
            return best[1], [best[2]] * len(best[1])
        fits = [x for x in seen if all(a >= b for a, b in zip(x, shape))]
        run = min(fits, key=lambda x: (math.prod(x[:4]), sum(x[4:]))) if fits else shape
        seen.add(run)
        return question_tree.uniform_chunks(parts, shape), [run] * n

    def chunk_plan(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix], extra: int,
                   splits: Sequence[int] | None = None) -> tuple[list[list[question_tree.Piece]], list[tuple]]:
        """The chunks a call of these questions runs (this host's pieces of each) and their shapes `(P, F, S, C,
        prefix, node, leaf lengths)`, `extra` tokens decoded after them: one shape for the call
        (`question_tree.call_shape`; on several hosts agreed in one collective), or with `reuse_shapes` one
        compiled before (`_reuse`). Host code alone: nothing runs on the devices."""
        # on several hosts a chunk's prefixes are over the host's batch shards too: pieces small enough that P
        # fills them (a prefix's copies are the ones its rows' devices need anyway)
        multiple = host_row_multiple(self.mesh)
        tree = question_tree.question_tree(suffixes, splits)
        most = max(1, self.host_batch // multiple)
        nodes = [node for nodes in tree.values() for node in nodes]
        leaves = [leaf for nodes in tree.values() for node in nodes.values() for leaf in node]
        lengths = [length_bucket(max((len(prefixes[o]) for o in tree), default=0)),
                   length_bucket(max(map(len, nodes), default=0)), length_bucket(max(map(len, leaves), default=0))]
        fans = question_tree.fan_outs(most)
        parts = question_tree.pieces(tree, most)
        # one collective: the hosts' level lengths and, for each fan-out, their number of parts cut to it
        agreed = distributed.host_max(np.concatenate([lengths, question_tree.cut_counts(parts, fans)]))
        lengths, counts = tuple(int(x) for x in agreed[:3]), agreed[3:]
        # this host's share of the slots
        budget = None if self.max_batch_tokens is None else max(1, self.max_batch_tokens // jax.process_count())
        shape, n = question_tree.call_shape(fans, counts, lengths, extra, self.host_batch, multiple, budget)
        if self.reuse_shapes and n:
            return self._reuse(parts, shape, n, extra)
        return question_tree.uniform_chunks(parts, shape), [shape] * n

    def _tree_caches(self, prefixes, suffixes, extra, splits) -> Iterator[tuple[list[int], np.ndarray, KVCache]]:
        """The chunks of the question tree (`chunk_plan`): each level prefilled once and branched to the next."""
        multiple = host_row_multiple(self.mesh)
        local, plan = self.chunk_plan(prefixes, suffixes, extra, splits)
        for k, (p, f, s, c, p_len, n_len, l_len) in enumerate(plan):
            chunk = local[k] if k < len(local) else []
            p = round_up(p, multiple)  # P prefixes (and the rows) a multiple of the host's batch shards
            questions, rows = question_tree.rows(chunk, f, s, c)
            heads = [list(prefixes[piece.owner]) for piece in chunk]
            heads += [[self.pad_id]] * (p - len(heads))  # padding prefixes: no questions
            node_ids, leaf_ids = segment_rows(chunk, p, f, s)
            cache = prefill(self.model, *pad_sequences(heads, p_len, self.pad_id, "left"), cache_size=p_len,
                            ring=False)
            if n_len:  # the shared first segments, F per prefix
                cache = extend(self.model, cache.branch(f, size=n_len, ring=False),
                               *pad_sequences(node_ids, n_len, self.pad_id, "right"))
            last = c == 1  # the leaves' own slots are the decoding rows' when nothing is copied
            size = round_up(max(l_len + (extra if last else 0), 1), ATTENTION_BLOCK)
            cache = cache.branch(s if n_len else f * s, size=size, ring=last)  # (no node tokens: the same rows)
            if l_len:
                cache = extend(self.model, cache, *pad_sequences(leaf_ids, l_len, self.pad_id, "right"))
            if not last:  # the copies: one row each, sharing the whole question
                cache = cache.branch(c, size=round_up(max(extra, 1), ATTENTION_BLOCK))
            prefilled = (sum(len(prefixes[piece.owner]) for piece in chunk)
                         + sum(len(node.tokens) for piece in chunk for node in piece.nodes)
                         + sum(len(leaf.tokens) for piece in chunk for node in piece.nodes for leaf in node.leaves))
            self.stats.calls += 1
            self.stats.prefill_tokens += prefilled
            self.stats.prefill_tokens_saved += sum(len(prefixes[suffixes[i][0]]) + len(suffixes[i][1])
                                                   for i in questions) - prefilled
            yield questions, np.asarray(rows, np.int64), cache


def segment_rows(chunk: list[question_tree.Piece], p: int, f: int, s: int) -> tuple[list[list[int]], list[list[int]]]:
    """The tokens of a chunk's nodes `[p * f]` (row `piece * f + node`) and leaves `[p * f * s]` (row
    `(piece * f + node) * s + leaf`); padding rows are empty."""
    nodes: list[list[int]] = [[] for _ in range(p * f)]
    leaves: list[list[int]] = [[] for _ in range(p * f * s)]
    for i, piece in enumerate(chunk):
        for n, node in enumerate(piece.nodes):
            nodes[i * f + n] = list(node.tokens)
            for j, leaf in enumerate(node.leaves):
                leaves[(i * f + n) * s + j] = list(leaf.tokens)
    return nodes, leaves

