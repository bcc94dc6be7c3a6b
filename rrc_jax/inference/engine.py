"""The JAX inference engine: the Sampler protocol (`rrc_jax.inference.sampler`) on a `Decoder`.

`generate` samples GRPO groups: each prompt is prefilled once and its G rows continue it (`KVCache.branch`).

`complete` and `next_token_logprobs` answer questions `(prefix index, suffix ids)`. With `prefix_reuse` (default)
questions are sorted by prefix, then by suffix length, and packed into chunks of P prefixes x M rows each (P and M
powers of two, P * M at most `max_batch`; a prefix with more than `max_batch` questions spans several chunks,
`prefix_chunks`). Each chunk prefills its P prefixes (left-padded, one call), branches from them
(`KVCache.branch`: shared, not copied; each row attends to its own prefix, read once per step for its M rows),
appends its right-padded suffixes (`extend`, `PREFILL_CHUNK` tokens at a time) and decodes, or reads the next-token
logits; rows without a question are padding and dropped. A prefix used by k questions of a chunk saves (k - 1) x its length in prefill tokens
(`stats.prefill_tokens_saved`). Without reuse every question is prefilled in full, in chunks of `max_batch` (rows
padded to multiples of 8). Lengths are padded to `length_bucket`s, so compilations are shared across chunks and
calls while padding stays small. A chunk never gathers rows of another chunk, so its rows stay where they are on
the mesh.

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
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rrc_jax import distributed
from rrc_jax.inference.kernels import decode, extend, generate, prefill
from rrc_jax.inference.rollout_copy import RolloutCopy
from rrc_jax.inference.sampler import SampleOutput, SamplerStats, SamplingParams, Suffix
from rrc_jax.models import stop_tokens
from rrc_jax.models.batches import agreed_chunks, bucket_length, length_bucket, pad_sequences, round_up
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


def _key(rng: jax.Array | int, i: int) -> jax.Array:
    """The PRNG key of chunk i of a call (a key made on another mesh, e.g. the trainer's, is taken by value)."""
    key = jax.random.key(rng) if isinstance(rng, int) else jax.random.wrap_key_data(
        np.asarray(jax.random.key_data(rng)), impl=jax.random.key_impl(rng))
    return jax.random.fold_in(key, i)


class JaxSampler:
    """The Sampler protocol on a `Decoder`.

    Args:
      model: the decoder (held, not copied: parameter updates applied to it are seen by the next call).
      tokenizer: its tokenizer (`tokenizer`); its EOS id is added to the model's stop tokens.
      max_batch: most rows per model call (a chunk), over the whole mesh.
      prefix_reuse: prefill a shared prefix once for all its questions (see the module docstring).
      stop_token_ids: ids that end a continuation when `SamplingParams.stop_token_ids` is None (default: the
        model's EOS ids and the tokenizer's, `stop_tokens`).
      pad_id: id written after a row ends (default: the model's pad id, else the tokenizer's, else 0).
      role: the role it samples for (`rrc_jax.sharding.ROLES`; `make_sampler` sets it).
      layout: decode from a copy of `model` in this layout (module docstring), its parameters in the model's
        compute dtype; None, or a layout of one device: decode from `model` itself.
    """

    def __init__(self, model: Decoder, tokenizer=None, *, max_batch: int = 256, prefix_reuse: bool = True,
                 stop_token_ids: Sequence[int] | None = None, pad_id: int | None = None, role: str = "policy",
                 layout: Layout | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch} must be >= 1")
        self.copy = RolloutCopy(model, layout, model.cfg.dtype) if layout is not None and layout.devices > 1 else None
        self.model = self.copy.model if self.copy is not None else model
        self.tokenizer, self.role = tokenizer, role
        self.max_batch = int(max_batch)
        self.prefix_reuse = prefix_reuse
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

    @_on_model_mesh
    def generate(self, prompt_ids: Sequence[Sequence[int]], group_size: int = 1,
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0) -> SampleOutput:
        """`group_size` continuations of each prompt: `SampleOutput` of `[B * G]` rows, prompt b's at
        `b*G ... b*G + G - 1`. Chunks hold whole groups, at most `max_batch` rows (at least one group). On several
        hosts, B is this host's prompts (any number, zero included, as long as some host has one)."""
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
            out = generate(self.model, chunk, params, rng=_key(rng, c), pad_id=self.pad_id, group_size=group_size)
            out = SampleOutput(*(x[:real * group_size] for x in out))
            self.stats.calls += 1
            self.stats.prefill_tokens += sum(map(len, chunk[:real]))
            self.stats.generated_tokens += int(out.lengths.sum())
            outs.append(out)
        return SampleOutput(*(np.concatenate(x) for x in zip(*outs)))

    # -- questions after shared prefixes ----------------------------------------------------------------

    @_on_model_mesh
    def complete(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix],
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0) -> SampleOutput:
        """One continuation of `prefixes[i] + suffix` per question `(i, suffix)`: `SampleOutput` of `[Q]` rows."""
        params = self._params(params)
        n, q = params.max_new_tokens, len(suffixes)
        tokens = np.full((q, n), self.pad_id, np.int32)
        logprobs = np.zeros((q, n), np.float32)
        lengths = np.zeros(q, np.int32)
        truncated = np.zeros(q, bool)
        for c, (chunk, rows, cache) in enumerate(self._caches(prefixes, suffixes, n)):
            out = decode(self.model, cache, params, rng=_key(rng, c), pad_id=self.pad_id)
            tokens[chunk], logprobs[chunk] = out.tokens[rows], out.logprobs[rows]
            lengths[chunk], truncated[chunk] = out.lengths[rows], out.truncated[rows]
            self.stats.generated_tokens += int(out.lengths[rows].sum())
        return SampleOutput(tokens, logprobs, lengths, truncated)

    @_on_model_mesh
    def next_token_logprobs(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix],
                            token_ids: Sequence[int]) -> np.ndarray:
        """`log_softmax(logits)[token_ids]` `[Q, len(token_ids)]` float32 at the position after each question."""
        ids = jnp.asarray(token_ids, jnp.int32)
        out = np.zeros((len(suffixes), len(token_ids)), np.float32)
        for chunk, rows, cache in self._caches(prefixes, suffixes, 0):
            out[chunk] = host_rows(jax.nn.log_softmax(cache.logits, axis=-1)[:, ids], self.mesh)[rows]
        return out

    def _caches(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix], extra: int
                ) -> Iterator[tuple[list[int], np.ndarray, KVCache]]:
        """(question indices of a chunk, the cache row of each, the chunk's cache with room for `extra` more
        tokens); the other rows of the cache are padding."""
        for i, (owner, _) in enumerate(suffixes):
            if not 0 <= owner < len(prefixes) or not prefixes[owner]:
                raise ValueError(f"question {i}: prefix index {owner} is out of range or its prefix is empty (every "
                                 "question needs at least one prefix token, e.g. BOS)")
        if self.prefix_reuse:
            yield from self._shared_caches(prefixes, suffixes, extra)
            return
        full = [list(prefixes[o]) + list(s) for o, s in suffixes]
        for chunk, n, t in agreed_chunks([len(f) for f in full], self.host_batch):
            rows = [full[i] for i in chunk] + [[self.pad_id]] * (self._rows(n) - len(chunk))
            ids, mask = pad_sequences(rows, t, self.pad_id, "left")
            self.stats.calls += 1
            self.stats.prefill_tokens += sum(len(full[i]) for i in chunk)
            yield chunk, np.arange(len(chunk)), prefill(self.model, ids, mask,
                                                        cache_size=round_up(t + max(extra, 1), ATTENTION_BLOCK))

    def _shared_caches(self, prefixes, suffixes, extra) -> Iterator[tuple[list[int], np.ndarray, KVCache]]:
        owners = [o for o, _ in suffixes]
        order = sorted(range(len(suffixes)), key=lambda i: (owners[i], len(suffixes[i][1])))
        # on several hosts a chunk's prefixes are over the host's batch shards too: pieces small enough that P
        # fills them (a prefix's copies are the ones its rows' devices need anyway)
        multiple = host_row_multiple(self.mesh)
        chunks = list(prefix_chunks(order, owners, self.host_batch, max(1, self.host_batch // multiple)))
        plan = distributed.agree([(bucket_length(len(groups), 1), bucket_length(max(map(len, groups)), 1),
                                   length_bucket(max(len(prefixes[owners[g[0]]]) for g in groups)),
                                   length_bucket(max(len(suffixes[i][1]) for g in groups for i in g)))
                                  for groups in chunks], 4)
        for k, (p, m, p_len, s_len) in enumerate(plan):
            groups = chunks[k] if k < len(chunks) else []
            p = round_up(p, multiple)  # P prefixes (and P x M rows) a multiple of the host's batch shards
            groups = groups + [[]] * (p - len(groups))  # padding prefixes: no questions
            chunk = [i for g in groups for i in g]
            rows = np.asarray([j * m + r for j, g in enumerate(groups) for r in range(len(g))], np.int64)
            row_suffixes: list[Sequence[int]] = [[] for _ in range(p * m)]  # padding rows: no suffix
            for row, i in zip(rows, chunk):
                row_suffixes[row] = suffixes[i][1]
            heads = [list(prefixes[owners[g[0]]]) if g else [self.pad_id] for g in groups]
            ids, mask = pad_sequences(heads, p_len, self.pad_id, "left")
            s_ids, s_mask = pad_sequences(row_suffixes, s_len, self.pad_id, "right")
            cache = prefill(self.model, ids, mask, cache_size=p_len, ring=False).branch(
                m, size=round_up(max(s_len + extra, 1), ATTENTION_BLOCK))
            if s_len:
                cache = extend(self.model, cache, s_ids, s_mask)
            prefilled = sum(len(h) for h, g in zip(heads, groups) if g)
            self.stats.calls += 1
            self.stats.prefill_tokens += prefilled + sum(len(suffixes[i][1]) for i in chunk)
            self.stats.prefill_tokens_saved += sum(len(prefixes[owners[i]]) for i in chunk) - prefilled
            yield chunk, rows, cache


def prefix_chunks(order: list[int], owners: list[int], max_rows: int, max_piece: int | None = None
                  ) -> Iterator[list[list[int]]]:
    """`order` (question indices sorted by prefix) as chunks, each a list of its prefixes' question lists: P
    prefixes of at most M questions each, with `bucket_length(P) * bucket_length(M) <= max_rows` (at least one).
    A prefix with more than `max_piece` (default `max_rows`) questions is cut into pieces, each its own prefix."""
    max_piece = max_rows if max_piece is None else max_piece
    pieces: list[list[int]] = []
    for i in order:  # each prefix's questions, in pieces of at most max_piece
        if pieces and owners[pieces[-1][-1]] == owners[i] and len(pieces[-1]) < max_piece:
            pieces[-1].append(i)
        else:
            pieces.append([i])
    chunk: list[list[int]] = []
    for piece in pieces:
        m = bucket_length(max([len(piece)] + [len(x) for x in chunk]), 1)
        if chunk and bucket_length(len(chunk) + 1, 1) * m > max_rows:
            yield chunk
            chunk = []
        chunk.append(piece)
    if chunk:
        yield chunk
