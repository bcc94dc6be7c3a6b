"""The decoder that the model families share (Llama 3.x, Qwen2 / Qwen2.5, Qwen3, Mistral, Gemma 2, Gemma 3:
`rrc_jax.models.families`).

Pre-norm transformer: token embedding -> L x [RMSNorm -> GQA self-attention with RoPE -> residual,
RMSNorm -> gated MLP -> residual] (the L layers' parameters stacked on a leading `layers` axis and run under a
scan, as MaxText's scanned layers) -> RMSNorm -> LM head (tied to the embedding or not) and, optionally,
a scalar value head (the DRM's Bradley-Terry score, Eq. 1). A sequence-classification checkpoint
(`LlamaForSequenceClassification`, ...: a `score` head, no LM head) is a decoder with the value head only
(`lm_head=False`).

What a family does differently lives in its module of `rrc_jax.models.families` (its `config.json` fields, its
extra tensors); the decoder implements the features they switch on: biases on q/k/v (`qkv_bias`), on o (`o_bias`)
and on the MLP (`mlp_bias`), RMSNorm of each query and key head (`qk_norm`), tied embeddings, the `linear` and
`llama3` RoPE frequency scalings, and Gemma's: embeddings scaled by sqrt(E), `(1 + w)` norms, norms after
attention and MLP too, GeGLU, `query_pre_attn_scalar`, soft-capped attention and output logits, and sliding-window
layers (`layer_types`, with their own RoPE base in Gemma 3). A sliding layer's window is a mask on RoPE positions,
so it holds in every attention path: training, log-probs, prefill, decode and shared prefixes (`Window`); a cache
longer than the window keeps only the window of a sliding layer (`KVCache.ring`).

LoRA (`rrc_jax.models.lora`, `cfg.lora`): adapters beside the q/k/v/o and gate/up/down projections, stacked and
scanned with the layers, their deltas added to the fused products; with a quantized base the projections are read
through `lora.weight` (qwix's dequantization, one layer at a time inside the scan).

Padding can sit anywhere. Positions derive from the attention mask (`cumsum(mask) - 1`), so left- and
right-padded batches give the same logits at their real tokens. For generation the model reads and writes a
`KVCache` whose per-slot validity mask lets a prefix prefilled once be extended by many suffixes
(see `rrc_jax.inference.kernels`).

Its pieces, one module each: the architecture (`rrc_jax.models.decoder_config`), RoPE (`rope`), the KV cache
(`kv_cache`), the attention kernels (`attention`) and a layer (`block`); this module embeds, scans the layers in
segments of one kind (`block.layer_segments`), reads the heads, and carries a cache through prefill, extend and decode.

Shapes: B batch, T new tokens, S cache slots, E embed, H query heads, K kv heads, G = H / K, D head dim,
I mlp width, V vocab, W sliding window, L_s sliding layers.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rrc_jax import sharding
from rrc_jax.models.attention import Window, softcap
from rrc_jax.models.block import SAVED_RESIDUALS, Block, init_param, layer_segments, norm, stack_layers
from rrc_jax.models.decoder_config import DecoderConfig
from rrc_jax.models.heads import ScalarHead
from rrc_jax.models.kv_cache import KVCache, RingStep, ring_plan
from rrc_jax.models.rope import rope_cos_sin, rope_inv_freq

ACTIVATION = ("batch", "length", "embed")  # logical axes of the residual stream [B, T, E] (`sharding.constrain`)


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """RoPE positions `[B, T]` of a padded batch: the index of each token among its row's real tokens."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)


def last_valid_index(mask: jax.Array) -> jax.Array:
    """Index `[B]` of the last real token of each row of `mask [B, T]` (0 for an empty row)."""
    t = mask.shape[1]
    return jnp.where(mask.any(axis=1), t - 1 - jnp.argmax(mask[:, ::-1], axis=1), 0)


def score_index(input_ids: jax.Array, mask: jax.Array, pad_token_id: int | None) -> jax.Array:
    """Index `[B]` of the token a sequence classifier scores in `input_ids [B, T]`: the last real token (`mask`)
    that is not `pad_token_id`, as transformers' `*ForSequenceClassification` picks it (its rightmost non-pad
    token), so a row ending in real tokens equal to the pad id (a pad id that is also EOS) is scored before them.
    With no pad id, the last real token."""
    mask = mask.astype(bool)
    return last_valid_index(mask if pad_token_id is None else mask & (input_ids != pad_token_id))


def prefix_positions(masks: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    """The RoPE position of every slot of a branched cache's prefix levels (`KVCache`), from their masks
    `[J, P_l, N_b]`: a slot's position is the number of valid slots before it in its prefix and its ancestors
    (level l + 1's prefix p continues level l's prefix `p // (P_{l+1} / P_l)`)."""
    out, before = [], None
    for mask in masks:
        j, p, nb = mask.shape
        flat = mask.swapaxes(0, 1).reshape(p, j * nb).astype(jnp.int32)  # each prefix's slots in order
        if before is None:
            before = jnp.zeros((p,), jnp.int32)
        else:
            before = jnp.repeat(before, p // before.shape[0])
        out.append((before[:, None] + jnp.cumsum(flat, axis=1) - 1).reshape(p, j, nb).swapaxes(0, 1))
        before = before + flat.sum(axis=1)
    return tuple(out)


class Decoder(nnx.Module):
    """The shared decoder (module docstring). `model(input_ids, attention_mask=mask)` -> logits `[B, T, V]`
    (float32)."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.inv_freq = tuple(float(f) for f in rope_inv_freq(cfg))  # static (hashable) constant, not a parameter
        if cfg.local_rope_theta is not None:  # the sliding layers' RoPE (Gemma 3): default, its own base
            local = cfg.replace(rope_theta=cfg.local_rope_theta, rope_type="default", rope_scaling=())
            self.local_inv_freq = tuple(float(f) for f in rope_inv_freq(local))
        pd = cfg.params_dtype
        self.embed = init_param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
        self.layers = stack_layers([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])  # [L, ...] each
        self.final_norm = norm(cfg, cfg.hidden_size, rngs)
        if cfg.lm_head and not cfg.tie_word_embeddings:
            self.lm_head = init_param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd)
        if cfg.value_head:
            self.value_head = ScalarHead(cfg.hidden_size, param_dtype=pd, rngs=rngs)

    # -- building blocks ---------------------------------------------------------------------------------

    def _run_layers(self, input_ids: jax.Array, positions: jax.Array, mask: jax.Array,
                    cache: KVCache | None = None, last_index: jax.Array | None = None, remat: bool = False,
                    key_positions: jax.Array | None = None, ring: RingStep | None = None,
                    dropout_seed: jax.Array | None = None) -> tuple[jax.Array, tuple | None]:
        """Final-normed hidden states `[B, T, E]` and, when a cache is given, its updated blocks and rings
        (k, v, ring_k, ring_v).

        The layers run under one `lax.scan` over their stacked parameters (one layer traced and compiled, whatever
        L). Without a cache (training, log-probs) the parameters are the scan's input, so their gradient is stacked
        the same way, and with FSDP each step gathers one layer's weights. The backward pass keeps each layer's
        input `[B, T, E]` and `SAVED_RESIDUALS`, and recomputes the rest one layer at a time; with `remat` it keeps
        only the input and recomputes the whole layer. With a cache (prefill, decode) the scan runs
        over layer indices, carrying the stacked cache, which each layer updates in place at its own index. In a
        cache whose sliding layers keep only their window (`KVCache.ring`, `ring` the extend's `ring_plan`), full
        and sliding layers read and write different stacks: the layers run as scans over the repeats of their
        pattern of kinds (`layer_segments`: Gemma 2's (sliding, full), Gemma 3's five sliding then one full), each
        kind known where it is traced (a `lax.switch` on it would copy the whole cache at every layer).

        With `last_index [B]`, only the hidden state `[B, 1, E]` of token `last_index[b]` of each row: the last
        layer, run after the scan, still writes every token's keys and values, but skips the attention and MLP of
        the others (nothing reads them). `key_positions [B, S]`: the positions of the keys (the cache's slots;
        default `positions`), read by sliding layers only (`layer_view`). `dropout_seed [B]` (uint32, without a
        cache): LoRA dropout's seed of each row, its key in layer i `fold_in(key(seed), i)` (`lora.delta`).
        """
        cfg = self.cfg
        x = jnp.take(self.embed[...], input_ids, axis=0).astype(cfg.compute_dtype)
        if cfg.embed_scale:
            x = x * jnp.asarray(math.sqrt(cfg.hidden_size), x.dtype)
        x = sharding.constrain(x, ACTIVATION)
        view = self.layer_view(positions, positions if key_positions is None else key_positions, cache)
        graphdef, params = nnx.split(self.layers)
        if cache is None:
            def layer(h, xs):
                p, i = xs
                cos, sin, window = view(i)
                keys = None if dropout_seed is None else jax.vmap(
                    lambda seed: jax.random.fold_in(jax.random.key(seed), i))(dropout_seed)
                h, _ = nnx.merge(graphdef, p)(h, cos, sin, mask, window=window, dropout=keys)
                return sharding.constrain(h, ACTIVATION), None

            policy = None if remat else jax.checkpoint_policies.save_only_these_names(*SAVED_RESIDUALS)
            x, _ = jax.lax.scan(jax.checkpoint(layer, prevent_cse=False, policy=policy), x,
                                (params, jnp.arange(cfg.num_layers)))
            return self.final_norm(x), None

        sliding = cache.sliding if cache.ring else (False,) * cfg.num_layers
        full_index = jnp.asarray(np.cumsum(~np.asarray(sliding)) - 1)  # a layer's index in its kind's stack
        ring_index = jnp.asarray(np.cumsum(sliding) - 1)

        def run(i, local, carry, query_index=None):  # layer i (traced), a sliding one in ring buffers when `local`
            h, k, v, ring_k, ring_v = carry
            block = nnx.merge(graphdef, jax.tree.map(lambda a: a[i], params))  # a slice of the stacked weights
            shared = tuple((k_[i], v_[i], m_) for k_, v_, m_ in zip(cache.shared_k, cache.shared_v,
                                                                     cache.shared_mask)) or None
            cos, sin, window = view(i)
            if local:
                step = ring._replace(k=ring_k, v=ring_v, index=ring_index[i])
                h, (ring_k, ring_v) = block(h, cos, sin, mask, None, cache.end, shared, query_index, 0, window, step)
            else:
                h, (k, v) = block(h, cos, sin, mask, (k, v), cache.end, shared, query_index, full_index[i], window)
            return sharding.constrain(h, ACTIVATION), k, v, ring_k, ring_v

        n = cfg.num_layers - (last_index is not None)
        carry = (x, cache.k, cache.v, cache.ring_k, cache.ring_v)
        for start, unit, reps in layer_segments(sliding[:n]):  # one scan over each repeated pattern of kinds
            def body(c, j, start=start, unit=unit):
                for offset, local in enumerate(unit):
                    c = run(start + j * len(unit) + offset, local, c)
                return c, None

            carry, _ = jax.lax.scan(body, carry, jnp.arange(reps))
        if last_index is not None:
            carry = run(n, sliding[n], carry, query_index=last_index)
        x, *kv = carry
        return self.final_norm(x), tuple(kv)

    def layer_view(self, positions: jax.Array, key_positions: jax.Array, cache: KVCache | None = None):
        """`view(i)` -> (cos, sin `[B, T, D]`, `Window` or None): what layer `i` (traced) attends with. Full and
        sliding layers differ in their RoPE base when the family has a local one (Gemma 3) and in their window
        (None when no layer slides). positions `[B, T]` of the queries, key_positions `[B, S]`; with a branched
        cache, the prefix slots' positions come from its `shared_mask`."""
        cfg = self.cfg
        cos, sin = rope_cos_sin(positions, self.inv_freq)
        if cfg.local_rope_theta is not None:
            sliding, local = jnp.asarray(cfg.sliding), rope_cos_sin(positions, self.local_inv_freq)
            rope = lambda i: (jnp.where(sliding[i], local[0], cos), jnp.where(sliding[i], local[1], sin))
        else:
            rope = lambda i: (cos, sin)
        if cfg.windows is None:
            return lambda i: (*rope(i), None)
        sizes, prefix = jnp.asarray(cfg.windows), None
        if cache is not None and cache.shared:
            prefix = prefix_positions(cache.shared_mask)
        return lambda i: (*rope(i), Window(sizes[i], positions, key_positions, prefix))

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
                      remat: bool = False, dropout_seed: jax.Array | None = None) -> jax.Array:
        """Final-normed hidden states `[B, T, E]` of a padded batch (no cache); `remat`: recompute each block in
        the backward pass; `dropout_seed [B]`: LoRA dropout's seed of each row, in a training pass (`_run_layers`)."""
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, bool)
        attention_mask = attention_mask.astype(bool)
        t = input_ids.shape[1]
        causal = jnp.tril(jnp.ones((t, t), bool))
        mask = causal[None] & attention_mask[:, None, :]
        h, _ = self._run_layers(input_ids, positions_from_mask(attention_mask), mask, remat=remat,
                                dropout_seed=dropout_seed)
        return h

    def logits_from_hidden(self, h: jax.Array) -> jax.Array:
        """LM-head logits `[..., V]` (float32) of hidden states `[..., E]`."""
        if not self.cfg.lm_head:
            raise ValueError("this model is a sequence classifier (a score head, no LM head): it scores sequences "
                             "(values) but gives no logits and cannot generate; use a causal LM checkpoint")
        w = self.embed[...].T if self.cfg.tie_word_embeddings else self.lm_head[...]
        logits = jnp.dot(h, w.astype(h.dtype), preferred_element_type=jnp.float32).astype(jnp.float32)
        if self.cfg.final_logit_softcapping:
            logits = softcap(logits, self.cfg.final_logit_softcapping)
        return sharding.constrain(logits, ("batch",) + (None,) * (logits.ndim - 2) + ("vocab",))

    # -- public API ----------------------------------------------------------------------------------------

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        """Logits `[B, T, V]` (float32) for `input_ids [B, T]`, `attention_mask [B, T]` (1 = real token)."""
        return self.logits_from_hidden(self.hidden_states(input_ids, attention_mask))

    def values(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        """Scalar value-head scores `[B]` (the DRM reward, Eq. 1) of `input_ids [B, T]`, read at each row's last
        real token that is not the pad id (`score_index`, as transformers' sequence classifiers)."""
        if not self.cfg.value_head:
            raise ValueError("this model has no value head; build it with DecoderConfig(value_head=True)")
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, bool)
        h = self.hidden_states(input_ids, attention_mask)
        index = score_index(input_ids, attention_mask, self.cfg.pad_token_id)
        last = jnp.take_along_axis(h, index[:, None, None], axis=1)[:, 0]
        return self.value_head(last)

    def token_logprobs(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
                       chunk_size: int = 128, return_entropy: bool = False, temperature: float = 1.0,
                       remat: bool = False, dropout_seed: jax.Array | None = None
                       ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """Log-probabilities `[B, T]` of each token given the ones before it, under `softmax(logits / temperature)`
        (the distribution a sampler at that temperature draws from); column 0 is 0.

        The LM head and log-softmax run over `chunk_size` positions at a time under `jax.checkpoint`, so neither
        the forward nor the backward pass materializes `[B, T, V]` logits. With `return_entropy`, also the
        entropy `[B, T]` of the predictive distribution that produced each token (column 0 is 0). `remat`: the
        decoder blocks are recomputed in the backward pass (`hidden_states`). `dropout_seed [B]` (uint32): a
        training pass with LoRA dropout, each row's masks drawn from its seed (so the same whatever the
        micro-batches); without it, none.
        """
        b, t = input_ids.shape
        h = self.hidden_states(input_ids, attention_mask, remat=remat, dropout_seed=dropout_seed)[:, :-1]
        targets = input_ids[:, 1:]
        n = t - 1
        c = max(1, min(chunk_size, n))
        pad = (-n) % c
        h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
        h = h.reshape(b, -1, c, h.shape[-1]).swapaxes(0, 1)  # [chunks, B, c, E]
        targets = targets.reshape(b, -1, c).swapaxes(0, 1)

        @jax.checkpoint
        def chunk(args):
            hc, tc = args
            logp = jax.nn.log_softmax(self.logits_from_hidden(hc) / temperature, axis=-1)
            tok = jnp.take_along_axis(logp, tc[..., None], axis=-1)[..., 0]
            ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
            return tok, ent

        tok, ent = jax.lax.map(chunk, (h, targets))
        fix = lambda x: jnp.pad(x.swapaxes(0, 1).reshape(b, -1)[:, :n], ((0, 0), (1, 0)))
        return (fix(tok), fix(ent)) if return_entropy else fix(tok)

    def extend(self, cache: KVCache, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> KVCache:
        """Append `input_ids [B, T]` (real where `attention_mask`) to `cache` at slots `[end, end + T)` (a cache of
        lanes, `KVCache.lanes`: each row at its own `end[b]`, right-padded, advancing by its real tokens).

        Returns the updated cache whose `logits` are the next-token logits after each row's last real token
        (unchanged for a row with no real token in this chunk). The caller keeps `end + T <= cache.size`
        (`rrc_jax.inference.kernels` checks it with a clear error).
        """
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, bool)
        new = attention_mask.astype(bool)
        t, s = input_ids.shape[1], cache.size
        if cache.lanes:  # each row's tokens at its own cursor; it advances by its real ones
            idx = jnp.arange(s)[None] - cache.end[:, None]  # [B, S] the new token landing in each slot
            hit = (idx >= 0) & (idx < t)
            valid = jnp.where(hit, jnp.take_along_axis(new, jnp.clip(idx, 0, t - 1), axis=1), cache.valid)
            slot_q, end = cache.end[:, None] + jnp.arange(t), cache.end + new.sum(axis=1, dtype=jnp.int32)
        else:
            valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, new, cache.end, axis=1)
            slot_q, end = jnp.broadcast_to(cache.end + jnp.arange(t), new.shape), cache.end + t
        mask = valid[:, None, :] & (jnp.arange(s)[None, None, :] <= slot_q[:, :, None])
        positions = cache.positions[:, None] + jnp.maximum(jnp.cumsum(new.astype(jnp.int32), axis=1) - 1, 0)
        key_positions = None
        if self.cfg.windows is not None:  # a slot's position: the row's tokens before it (its prefix's included)
            before = cache.positions - cache.valid.sum(axis=1, dtype=jnp.int32)
            key_positions = before[:, None] + jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1
        ring, ring_positions = None, cache.ring_positions
        if cache.ring:
            ring, ring_positions = ring_plan(cache.ring_positions, positions, cache.positions, new, cache.window)
        last = last_valid_index(new) if t > 1 else None  # (one token: the layers' output is already [B, 1, E])
        h, (k, v, ring_k, ring_v) = self._run_layers(input_ids, positions, mask, cache, last_index=last,
                                                     key_positions=key_positions, ring=ring)
        last = h[:, 0]
        logits = jnp.where(new.any(axis=1)[:, None], self.logits_from_hidden(last), cache.logits)
        return cache.replace(k=k, v=v, ring_k=ring_k, ring_v=ring_v, ring_positions=ring_positions, valid=valid,
                             positions=cache.positions + new.sum(axis=1, dtype=jnp.int32), end=end,
                             logits=logits)
