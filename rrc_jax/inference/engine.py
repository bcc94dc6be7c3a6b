"""The JAX inference engine: the Sampler protocol (`rrc_jax.inference.sampler`) on a `Decoder`.

`generate` samples GRPO groups: each prompt is prefilled once and its G rows continue it (`KVCache.branch`).

`complete` and `next_token_logprobs` answer questions `(prefix index, suffix ids)`. With `prefix_reuse` (default)
every prefix that a question uses is prefilled once (left-padded, one call); questions are sorted by prefix, then
by suffix length (so a chunk continues few prefixes), and cut into chunks of at most `max_batch` rows and
`max_prefixes` distinct prefixes. Each chunk
branches from its prefixes (shared, not copied: attention reads a prefix once per step for all its rows), appends
its right-padded suffixes (`extend`) and decodes, or reads the next-token logits. A prefix used by k questions
saves (k - 1) x its length in prefill tokens (`stats.prefill_tokens_saved`). A chunk's prefixes are attended as one
concatenated prefix by all its rows, so its attention cost grows with rows x prefixes: `max_prefixes` bounds it
(a judged eval asks one or two questions per prompt; without the bound one chunk would hold hundreds of prompts'
prefixes). Without reuse every question is
prefilled in full. Row counts are padded to multiples of 8 and lengths to `length_bucket`s, so compilations are
shared across chunks and calls while padding stays small.

Shapes: Q questions, P prefixes, R rows of a chunk, N new tokens, V vocab.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rrc_jax.data.batches import bucket_length, length_bucket, pad_sequences, round_up
from rrc_jax.inference.sampler import SampleOutput, SamplerStats, SamplingParams, Suffix, stop_tokens
from rrc_jax.inference.sampling import decode, extend, generate, prefill
from rrc_jax.models.decoder import ATTENTION_BLOCK, Decoder, KVCache
from rrc_jax.sharding import to_host


MAX_PREFIXES = 16  # distinct prefixes per chunk of questions, by default (module docstring)


def _key(rng: jax.Array | int, i: int) -> jax.Array:
    """The PRNG key of chunk i of a call."""
    return jax.random.fold_in(jax.random.key(rng) if isinstance(rng, int) else rng, i)


class JaxSampler:
    """The Sampler protocol on a `Decoder`.

    Args:
      model: the decoder (held, not copied: parameter updates applied to it are seen by the next call).
      tokenizer: its tokenizer; only its EOS id is read (added to the model's stop tokens).
      max_batch: most rows per model call (a chunk).
      prefix_reuse: prefill a shared prefix once for all its questions (see the module docstring).
      max_prefixes: most distinct prefixes per chunk (bounds the shared-prefix attention, module docstring).
      stop_token_ids: ids that end a continuation when `SamplingParams.stop_token_ids` is None (default: the
        model's EOS ids and the tokenizer's, `stop_tokens`).
      pad_id: id written after a row ends (default: the model's pad id, else the tokenizer's, else 0).
    """

    def __init__(self, model: Decoder, tokenizer=None, *, max_batch: int = 256, prefix_reuse: bool = True,
                 max_prefixes: int = MAX_PREFIXES, stop_token_ids: Sequence[int] | None = None, pad_id: int | None = None):
        if max_batch < 1 or max_prefixes < 1:
            raise ValueError(f"max_batch={max_batch} and max_prefixes={max_prefixes} must be >= 1")
        self.max_prefixes = int(max_prefixes)
        self.model = model
        self.max_batch = int(max_batch)
        self.prefix_reuse = prefix_reuse
        self.stop_token_ids = (tuple(int(t) for t in stop_token_ids) if stop_token_ids is not None
                               else stop_tokens(model.cfg.eos_token_ids, tokenizer))
        if pad_id is None:
            pad_id = model.cfg.pad_token_id if model.cfg.pad_token_id is not None else getattr(
                tokenizer, "pad_token_id", None)
        self.pad_id = int(pad_id or 0)
        self.stats = SamplerStats()

    def _params(self, params: SamplingParams) -> SamplingParams:
        if params.stop_token_ids is not None:
            return params
        return dataclasses.replace(params, stop_token_ids=self.stop_token_ids)

    def _rows(self, n: int) -> int:
        """Rows of a chunk of n questions: n rounded up to a multiple of 8 (at most max_batch)."""
        return min(self.max_batch, round_up(n, 8))

    # -- generate ---------------------------------------------------------------------------------------

    def generate(self, prompt_ids: Sequence[Sequence[int]], group_size: int = 1,
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0) -> SampleOutput:
        """`group_size` continuations of each prompt: `SampleOutput` of `[B * G]` rows, prompt b's at
        `b*G ... b*G + G - 1`. Chunks hold whole groups, at most `max_batch` rows (at least one group)."""
        params = self._params(params)
        per_chunk = max(1, self.max_batch // group_size)
        outs = []
        for c, start in enumerate(range(0, len(prompt_ids), per_chunk)):
            chunk = prompt_ids[start:start + per_chunk]
            out = generate(self.model, chunk, params, rng=_key(rng, c), pad_id=self.pad_id, group_size=group_size)
            self.stats.calls += 1
            self.stats.prefill_tokens += sum(map(len, chunk))
            self.stats.generated_tokens += int(out.lengths.sum())
            outs.append(out)
        if not outs:
            raise ValueError("generate() got no prompts")
        return SampleOutput(*(np.concatenate(x) for x in zip(*outs)))

    # -- questions after shared prefixes ----------------------------------------------------------------

    def complete(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix],
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0) -> SampleOutput:
        """One continuation of `prefixes[i] + suffix` per question `(i, suffix)`: `SampleOutput` of `[Q]` rows."""
        params = self._params(params)
        n, q = params.max_new_tokens, len(suffixes)
        tokens = np.full((q, n), self.pad_id, np.int32)
        logprobs = np.zeros((q, n), np.float32)
        lengths = np.zeros(q, np.int32)
        truncated = np.zeros(q, bool)
        for c, (chunk, cache) in enumerate(self._caches(prefixes, suffixes, n)):
            out = decode(self.model, cache, params, rng=_key(rng, c), pad_id=self.pad_id)
            k = len(chunk)
            tokens[chunk], logprobs[chunk] = out.tokens[:k], out.logprobs[:k]
            lengths[chunk], truncated[chunk] = out.lengths[:k], out.truncated[:k]
            self.stats.generated_tokens += int(out.lengths[:k].sum())
        return SampleOutput(tokens, logprobs, lengths, truncated)

    def next_token_logprobs(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix],
                            token_ids: Sequence[int]) -> np.ndarray:
        """`log_softmax(logits)[token_ids]` `[Q, len(token_ids)]` float32 at the position after each question."""
        ids = jnp.asarray(token_ids, jnp.int32)
        out = np.zeros((len(suffixes), len(token_ids)), np.float32)
        for chunk, cache in self._caches(prefixes, suffixes, 0):
            out[chunk] = to_host(jax.nn.log_softmax(cache.logits, axis=-1)[:, ids])[:len(chunk)]
        return out

    def _caches(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix], extra: int
                ) -> Iterator[tuple[list[int], KVCache]]:
        """(question indices of a chunk, its cache holding every question, room for `extra` more tokens); the
        cache has at least as many rows as the chunk has questions (padding rows at the end)."""
        for i, (owner, _) in enumerate(suffixes):
            if not 0 <= owner < len(prefixes) or not prefixes[owner]:
                raise ValueError(f"question {i}: prefix index {owner} is out of range or its prefix is empty (every "
                                 "question needs at least one prefix token, e.g. BOS)")
        if self.prefix_reuse:
            yield from self._shared_caches(prefixes, suffixes, extra)
            return
        full = [list(prefixes[o]) + list(s) for o, s in suffixes]
        order = sorted(range(len(full)), key=lambda i: len(full[i]))
        for start in range(0, len(order), self.max_batch):
            chunk = order[start:start + self.max_batch]
            rows = chunk + [chunk[-1]] * (self._rows(len(chunk)) - len(chunk))
            t = length_bucket(max(len(full[i]) for i in chunk))
            ids, mask = pad_sequences([full[i] for i in rows], t, self.pad_id, "left")
            self.stats.calls += 1
            self.stats.prefill_tokens += sum(len(full[i]) for i in chunk)
            yield chunk, prefill(self.model, ids, mask, cache_size=round_up(t + max(extra, 1), ATTENTION_BLOCK))

    def _prefix_chunks(self, order: list[int], owners: list[int]) -> Iterator[list[int]]:
        """`order` (questions sorted by prefix) cut into chunks of at most `max_batch` questions and
        `max_prefixes` distinct prefixes."""
        chunk: list[int] = []
        n_prefixes = 0
        for i in order:
            new_prefix = not chunk or owners[i] != owners[chunk[-1]]
            if chunk and (len(chunk) == self.max_batch or (new_prefix and n_prefixes == self.max_prefixes)):
                yield chunk
                chunk, n_prefixes, new_prefix = [], 0, True
            chunk.append(i)
            n_prefixes += new_prefix
        if chunk:
            yield chunk

    def _shared_caches(self, prefixes, suffixes, extra) -> Iterator[tuple[list[int], KVCache]]:
        used = sorted({o for o, _ in suffixes})
        if not used:
            return
        row_of = {o: r for r, o in enumerate(used)}
        p_len = length_bucket(max(len(prefixes[o]) for o in used))
        ids, mask = pad_sequences([prefixes[o] for o in used], p_len, self.pad_id, "left")
        prefix_cache = prefill(self.model, ids, mask, cache_size=p_len)
        prefilled = sum(len(prefixes[o]) for o in used)
        self.stats.prefill_tokens += prefilled
        self.stats.prefill_tokens_saved += sum(len(prefixes[o]) for o, _ in suffixes) - prefilled
        order = sorted(range(len(suffixes)), key=lambda i: (suffixes[i][0], len(suffixes[i][1])))
        for chunk in self._prefix_chunks(order, [o for o, _ in suffixes]):
            rows = chunk + [chunk[-1]] * (self._rows(len(chunk)) - len(chunk))
            s_len = length_bucket(max(len(suffixes[i][1]) for i in chunk))
            s_ids, s_mask = pad_sequences([suffixes[i][1] for i in rows], s_len, self.pad_id, "right")
            s_mask[len(chunk):] = False  # padding rows: no suffix, results dropped
            chunk_prefixes = sorted({row_of[suffixes[i][0]] for i in chunk})
            local = {o: j for j, o in enumerate(chunk_prefixes)}
            chunk_prefixes += chunk_prefixes[-1:] * (bucket_length(len(chunk_prefixes), 1) - len(chunk_prefixes))
            cache = prefix_cache.take(jnp.asarray(chunk_prefixes, jnp.int32)).branch(
                jnp.asarray([local[row_of[suffixes[i][0]]] for i in rows], jnp.int32),
                size=round_up(max(s_len + extra, 1), ATTENTION_BLOCK))
            if s_len:
                cache = extend(self.model, cache, s_ids, s_mask)
            self.stats.calls += 1
            self.stats.prefill_tokens += sum(len(suffixes[i][1]) for i in chunk)
            yield chunk, cache
