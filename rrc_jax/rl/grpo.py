"""GRPO in pure JAX: group advantages (Eq. 4) and the clipped surrogate loss (IRPO Appendix C), with the options
the peers' learners have.

* The advantage (`rl.advantage`, the registry `ADVANTAGES`): GRPO's group-normalised one (Eq. 4), Dr.GRPO's mean-centred one
  without the std ("Understanding R1-Zero-Like Training: A Critical Perspective", section 3.2) and RLOO's
  leave-one-out baseline ("Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback
  in LLMs", section 3.2).
* The importance ratio (`rl.loss`, the registry `LOSSES`): GRPO's per token, GSPO's length-normalised sequence ratio and its
  token variant ("Group Sequence Policy Optimization", sections 4.1 and 4.3), each clipped to its own default range
  (`Loss.clip_range`) unless `rl.eps_low` / `rl.eps_high` are set.
* DAPO's overlong reward shaping ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale", section 3.4;
  `overlong_penalty`). Its dynamic sampling draws prompts (`rrc_jax.rl.rollout.DynamicSampling`).

Everything here is jit-compatible and differentiable; option names that change the program (the estimator, the loss,
``aggregation``, whether a reference is given) are static, numeric hyper-parameters are traced.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rrc_jax.rewards._checks import check_option, check_rank, check_real, is_concrete
from rrc_jax.settings import at_least, field_error, one_of, unset

AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")


# -- the advantage estimators (`rl.advantage`) ----------------------------------------------------------------------

class Advantage(NamedTuple):
    """An advantage estimator: `centered(r, eps)` maps rewards `[B, m]` to advantages (a flat group's are set to 0
    by `group_advantages`), defined for groups of at least `min_group`."""

    centered: Callable[[jax.Array, jax.Array], jax.Array]
    min_group: int = 1


def _group_norm(r: jax.Array, eps: jax.Array) -> jax.Array:
    """GRPO, Eq. 4: (r_i - mu_r) / (sigma_r + eps), sigma with 1/m (ddof=0)."""
    return (r - jnp.mean(r, axis=-1, keepdims=True)) / (jnp.std(r, axis=-1, keepdims=True) + eps)


def _mean_centred(r: jax.Array, eps: jax.Array) -> jax.Array:
    """Dr.GRPO, section 3.2: r_i - mu_r."""
    return r - jnp.mean(r, axis=-1, keepdims=True)


def _leave_one_out(r: jax.Array, eps: jax.Array) -> jax.Array:
    """RLOO: r_i - 1/(m-1) sum_{j != i} r_j = m/(m-1) (r_i - mu_r)."""
    m = r.shape[-1]
    return (r - jnp.mean(r, axis=-1, keepdims=True)) * (m / (m - 1))


ADVANTAGES: dict[str, Advantage] = {"group_norm": Advantage(_group_norm), "rlvr_no_std": Advantage(_mean_centred),
                                    "rloo": Advantage(_leave_one_out, min_group=2)}


# -- the importance ratios (`rl.loss`) --------------------------------------------------------------------------------

class Loss(NamedTuple):
    """A GRPO-family loss: `log_ratio(logp, old, mask)` gives the log importance ratio `[B, T]` of each token, and
    `clip_range` its default (eps_low, eps_high)."""

    log_ratio: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
    clip_range: tuple[float, float]


def _token_ratio(logp: jax.Array, old: jax.Array, mask: jax.Array) -> jax.Array:
    """GRPO: log pi_theta(y_t | x, y_<t) - log pi_old(y_t | x, y_<t), per token."""
    return logp - old


def _sequence_log_ratio(logp: jax.Array, old: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO's log s_i = 1/|y_i| sum_t (log pi_theta - log pi_old) `[B, 1]`."""
    n = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1)
    return jnp.sum(jnp.where(mask, logp - old, 0.0), axis=-1, keepdims=True) / n


def _sequence_ratio(logp: jax.Array, old: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO (section 4.1): log s_i, s_i = (pi_theta(y_i | x) / pi_old(y_i | x))^(1/|y_i|), the same for every token
    of sequence i."""
    return jnp.broadcast_to(_sequence_log_ratio(logp, old, mask), logp.shape)


def _sequence_ratio_per_token(logp: jax.Array, old: jax.Array, mask: jax.Array) -> jax.Array:
    """GSPO-token (section 4.3): log s_i,t = sg[log s_i] + log pi_theta(y_t) - sg[log pi_theta(y_t)]: the value of
    s_i, the gradient of token t's own log-probability."""
    seq = _sequence_log_ratio(logp, old, mask)
    return jax.lax.stop_gradient(seq) + logp - jax.lax.stop_gradient(logp)


# Each loss's clip range of its ratio: PPO's 0.2 for GRPO's token ratio; GSPO's for its sequence ratio, whose length
# normalisation keeps it near 1 ("Group Sequence Policy Optimization", section 5.1: 3e-4, 4e-4).
LOSSES: dict[str, Loss] = {"grpo": Loss(_token_ratio, (0.2, 0.2)), "gspo": Loss(_sequence_ratio, (3e-4, 4e-4)),
                           "gspo_token": Loss(_sequence_ratio_per_token, (3e-4, 4e-4))}


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """The GRPO objective's hyper-parameters (`rl`): the advantage estimator, the ratio (`loss`) and its clip range
    1 - eps_low .. 1 + eps_high (DAPO's decoupled clip; unset: the loss's `Loss.clip_range`), the k3 KL's coefficient,
    how token losses are aggregated, and DAPO's overlong shaping of the rewards."""

    GROUP: ClassVar[str] = "rl"
    advantage: str = "group_norm"  # `ADVANTAGES`: GRPO's Eq. 4, Dr.GRPO's (no std), RLOO's leave-one-out
    loss: str = "grpo"  # `LOSSES`: the importance ratio per token (GRPO) or of the sequence (GSPO)
    eps_low: float | None = unset(float)  # None: the loss's own (`Loss.clip_range`)
    eps_high: float | None = unset(float)
    beta: float = 1e-3  # KL coefficient to the frozen reference: RM-R1's and IRPO's (the paper gives none)
    loss_aggregation: str = "seq_mean_token_mean"
    overlong: int = 0  # DAPO's soft overlong punishment over the last this many tokens of rl.max_new_tokens (0: off)
    overlong_penalty: float = 1.0  # the punishment of a response that reaches rl.max_new_tokens

    def __post_init__(self):
        one_of("rl", "advantage", self.advantage, ADVANTAGES)
        one_of("rl", "loss", self.loss, LOSSES)
        eps_low, eps_high = self.clip_range
        if not 0 <= eps_low < 1:
            raise field_error("rl", "eps_low", f"{eps_low} must be in [0, 1) (the ratio's lower clip is "
                              "1 - eps_low)")
        at_least("rl", "eps_high", eps_high, 0, "the ratio's upper clip is 1 + eps_high")
        at_least("rl", "beta", self.beta, 0)
        one_of("rl", "loss_aggregation", self.loss_aggregation, AGGREGATIONS)
        at_least("rl", "overlong", self.overlong, 0)
        at_least("rl", "overlong_penalty", self.overlong_penalty, 0)

    @property
    def clip_range(self) -> tuple[float, float]:
        """(eps_low, eps_high): as set, else the loss's default (`Loss.clip_range`)."""
        low, high = LOSSES[self.loss].clip_range
        return (low if self.eps_low is None else self.eps_low), (high if self.eps_high is None else self.eps_high)


@functools.partial(jax.jit, static_argnames=("estimator",))
def _group_advantages(r: jax.Array, eps: jax.Array, estimator: str) -> jax.Array:
    flat = jnp.max(r, axis=-1, keepdims=True) == jnp.min(r, axis=-1, keepdims=True)
    return jnp.where(flat, 0.0, ADVANTAGES[estimator].centered(r, eps))


def group_advantages(rewards, estimator: str = "group_norm", eps: float = 1e-6) -> jax.Array:
    """Each response's advantage within its prompt's group of m, by `estimator` (`ADVANTAGES`):

    * ``group_norm`` (GRPO, Eq. 4): ``A_i = (r_i - mean(r)) / (std(r) + eps)``, the population std (``1/m``);
    * ``rlvr_no_std`` (Dr.GRPO, section 3.2): ``A_i = r_i - mean(r)``;
    * ``rloo`` (RLOO, "Back to Basics", section 3.2): ``A_i = r_i - 1/(m - 1) sum_{j != i} r_j``, the mean of the
      others as the baseline (``= m / (m - 1) (r_i - mean(r))``).

    Args:
      rewards: ``[batch, group]`` rewards, one row per prompt (e.g. from ``scr_rewards`` / ``agr_rewards``); RLOO
        needs a group of at least 2.
      estimator: one of `ADVANTAGES`.
      eps: added to the standard deviation (``group_norm``). Invariance to ``r -> b r + d`` (``b > 0``, Eq. 13)
        holds up to ``eps / (b std)``.

    Returns:
      ``[batch, group]`` float32 advantages. A group whose rewards are all equal gets exactly zero advantages (no
      learning signal, rather than amplified rounding noise), whatever the estimator.
    """
    check_option(estimator, ADVANTAGES, "estimator")
    _, m = check_rank(rewards, 2, "rewards", "[batch, group]")
    check_real(rewards, "rewards")
    if m < ADVANTAGES[estimator].min_group:
        raise ValueError(f"the {estimator} advantage needs at least {ADVANTAGES[estimator].min_group} responses per "
                         f"group, got {m}")
    return _group_advantages(jnp.asarray(rewards, jnp.float32), jnp.asarray(eps, jnp.float32), estimator)


def overlong_penalty(lengths, max_new_tokens: int, cache: int, penalty: float = 1.0) -> np.ndarray:
    """DAPO's soft overlong punishment (section 3.4) of responses of `lengths [...]` tokens, added to their rewards:
    with ``L_max = max_new_tokens`` and ``L_cache = cache``, ``R_length(y) = 0`` for ``|y| <= L_max - L_cache``,
    ``((L_max - L_cache) - |y|) / L_cache`` up to ``|y| = L_max`` (a linear ramp to -1), and -1 beyond (a
    response cut at ``L_max`` is at -1); times `penalty`. `cache` 0: no shaping (zeros)."""
    lengths = np.asarray(lengths, np.float64)
    if cache <= 0:
        return np.zeros(lengths.shape, np.float32)
    if cache > max_new_tokens:
        raise ValueError(f"the overlong window ({cache} tokens) must fit in max_new_tokens={max_new_tokens}")
    expected = max_new_tokens - cache
    ramp = np.clip((expected - lengths) / cache, -1.0, 0.0)
    return (penalty * ramp).astype(np.float32)


def aggregation_weight(mask, aggregation: str) -> jax.Array:
    """The denominator of `grpo_loss`'s mean under `aggregation` for `mask [batch, time]`: valid tokens
    (`token_mean`), sequences with a valid token (`seq_mean_token_mean`) or sequences (`seq_mean_token_sum_norm`).

    A minibatch's loss is the weight-weighted mean of its micro-batches' losses (`rrc_jax.rl.learner`): gradient
    accumulation is then exact for every aggregation."""
    check_option(aggregation, AGGREGATIONS, "aggregation")
    mask = jnp.asarray(mask).astype(bool)
    if aggregation == "token_mean":
        return jnp.sum(mask).astype(jnp.float32)
    if aggregation == "seq_mean_token_mean":
        return jnp.sum(jnp.any(mask, axis=-1)).astype(jnp.float32)
    return jnp.asarray(mask.shape[0], jnp.float32)


def _masked_sum(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    return jnp.sum(jnp.where(mask, x, 0.0), axis=axis)


def _aggregate(per_token: jax.Array, mask: jax.Array, aggregation: str, norm: jax.Array) -> jax.Array:
    """Reduce ``[batch, time]`` per-token losses to a scalar; masked tokens never contribute."""
    if aggregation == "token_mean":  # DAPO: every valid token in the batch weighs the same
        return _masked_sum(per_token, mask) / jnp.maximum(jnp.sum(mask), 1)
    seq_sum = _masked_sum(per_token, mask, axis=-1)  # [batch]
    if aggregation == "seq_mean_token_sum_norm":  # Dr.GRPO: token sum over a constant, then mean over sequences
        return jnp.mean(seq_sum / norm)
    # GRPO: 1/G sum_i 1/|o_i| sum_t; sequences without a valid token are left out of the mean over sequences.
    n_tok = jnp.sum(mask, axis=-1)
    has_tok = n_tok > 0
    seq_mean = seq_sum / jnp.maximum(n_tok, 1)
    return jnp.sum(jnp.where(has_tok, seq_mean, 0.0)) / jnp.maximum(jnp.sum(has_tok), 1)


@functools.partial(jax.jit, static_argnames=("aggregation", "has_ref", "loss"))
def _grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, eps_low, eps_high, beta, norm, *,
               aggregation: str, has_ref: bool, loss: str):
    mask = mask.astype(bool)
    f32 = jnp.promote_types(logprobs.dtype, jnp.float32)  # bf16 -> f32; f64 stays f64 (x64 mode)
    # Replace padded positions before any arithmetic, so NaN / inf there cannot leak into values or gradients.
    logp = jnp.where(mask, logprobs.astype(f32), 0.0)
    old = jnp.where(mask, old_logprobs.astype(f32), 0.0)
    adv = advantages.astype(f32)[:, None]  # A_i, the same for every token of o_i
    eps_low, eps_high, beta, norm = (jnp.asarray(x).astype(f32) for x in (eps_low, eps_high, beta, norm))

    ratio = jnp.exp(LOSSES[loss].log_ratio(logp, old, mask))  # pi_theta / pi_theta_old: of token t, or GSPO's s_i
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    policy_tok = -jnp.minimum(unclipped, clipped)  # IRPO Appendix C, negated (we minimise)

    if has_ref:
        ref = jnp.where(mask, ref_logprobs.astype(f32), 0.0)
        log_ref_ratio = ref - logp
        kl_tok = jnp.exp(log_ref_ratio) - log_ref_ratio - 1.0  # k3: pi_ref/pi - log(pi_ref/pi) - 1 >= 0
    else:
        kl_tok = jnp.zeros_like(logp)
    total = _aggregate(policy_tok + beta * kl_tok, mask, aggregation, norm)

    n_tok = jnp.maximum(jnp.sum(mask), 1)
    clip_low = mask & (adv < 0) & (ratio < 1.0 - eps_low)
    clip_high = mask & (adv > 0) & (ratio > 1.0 + eps_high)
    any_tok = jnp.any(mask)
    metrics = {
        "policy_loss": _aggregate(policy_tok, mask, aggregation, norm),
        "kl": _masked_sum(kl_tok, mask) / n_tok,
        "clip_fraction": jnp.sum(clip_low | clip_high) / n_tok,
        "clip_low_fraction": jnp.sum(clip_low) / n_tok,
        "clip_high_fraction": jnp.sum(clip_high) / n_tok,
        "ratio_mean": jnp.where(any_tok, _masked_sum(ratio, mask) / n_tok, 1.0),
        "ratio_min": jnp.where(any_tok, jnp.min(jnp.where(mask, ratio, jnp.inf)), 1.0),
        "ratio_max": jnp.where(any_tok, jnp.max(jnp.where(mask, ratio, -jnp.inf)), 1.0),
        "num_tokens": jnp.sum(mask).astype(f32),
    }
    return total, jax.tree.map(lambda x: jax.lax.stop_gradient(x.astype(f32)), metrics)


def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, *, eps_low: float = 0.2,
              eps_high: float = 0.2, beta: float = 0.0, aggregation: str = "seq_mean_token_mean",
              max_len: int | None = None, loss: str = "grpo") -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped GRPO surrogate with a k3 KL penalty; returns ``(loss, metrics)``, to be minimised.

    Per valid token ``t`` of sequence ``i`` with ``rho = exp(logprobs - old_logprobs)`` (GRPO; GSPO's ``rho`` is
    the sequence's ``s_i`` for every token, `Loss.log_ratio`)::

        l_it = -min(rho A_i, clip(rho, 1 - eps_low, 1 + eps_high) A_i) + beta * k3_it
        k3_it = exp(ref - logprobs) - (ref - logprobs) - 1      (unbiased, non-negative estimate of KL(pi || ref))

    With ``loss='gspo'`` and the GRPO aggregation this is GSPO's objective, ``1/G sum_i min(s_i A_i, clip(s_i) A_i)``
    (section 4.1), plus the KL.

    Args:
      logprobs: ``[batch, time]`` log-probabilities of the sampled tokens under the policy being trained
        (differentiable). ``batch`` counts sequences: prompts x group size, flattened.
      old_logprobs: ``[batch, time]`` log-probabilities under the sampling policy ``pi_theta_old`` (stored at
        rollout time; with one inner iteration they equal ``stop_gradient(logprobs)``).
      ref_logprobs: ``[batch, time]`` log-probabilities under the frozen reference, or ``None`` (then ``beta`` must
        be 0 and the ``kl`` metric is 0).
      advantages: ``[batch]`` per-sequence advantages, e.g. ``group_advantages(r).reshape(-1)``.
      mask: ``[batch, time]`` bool (or 0/1) marking response tokens. Masked positions never contribute, whatever
        their values (NaN or inf included), to the loss, the gradient or the metrics.
      eps_low, eps_high: the clip range ``[1 - eps_low, 1 + eps_high]`` (DAPO's decoupled clip; equal values give
        GRPO / PPO).
      beta: KL coefficient.
      aggregation: how per-token losses become a scalar:
        ``'seq_mean_token_mean'`` (GRPO): mean over tokens within each sequence, then mean over sequences (sequences
        with no valid token are left out);
        ``'token_mean'`` (DAPO): mean over all valid tokens of the batch;
        ``'seq_mean_token_sum_norm'`` (Dr.GRPO): each sequence's token sum divided by the constant ``max_len``, then
        mean over all ``batch`` sequences, so the loss has no length bias.
      max_len: the Dr.GRPO constant (default ``time``); ignored by the other modes.
      loss: the importance ratio, one of `LOSSES` (`Loss.log_ratio`).

    Returns:
      ``(loss, metrics)``: scalar loss (float32; float64 for float64 inputs in x64 mode) and a dict of scalars
      (gradients stopped):
      ``policy_loss`` (the clipped term alone, same aggregation), ``kl`` (token mean of k3), ``clip_fraction`` (share
      of valid tokens where the clipped branch is active, i.e. whose gradient is cut), ``clip_low_fraction`` /
      ``clip_high_fraction`` (its two sides), ``ratio_mean`` / ``ratio_min`` / ``ratio_max`` (over valid tokens) and
      ``num_tokens``. Use ``jax.grad(grpo_loss, has_aux=True)`` (or ``value_and_grad``) to differentiate.
    """
    check_option(aggregation, AGGREGATIONS, "aggregation")
    check_option(loss, LOSSES, "loss")
    b, t = check_rank(logprobs, 2, "logprobs", "[batch, time]")
    named = {"old_logprobs": old_logprobs, "mask": mask}
    if ref_logprobs is not None:
        named["ref_logprobs"] = ref_logprobs
    for name, x in named.items():
        if tuple(jnp.shape(x)) != (b, t):
            raise ValueError(f"{name} must have the shape of logprobs [batch, time] = {(b, t)}, got {jnp.shape(x)}.")
    if tuple(jnp.shape(advantages)) != (b,):
        raise ValueError(
            f"advantages must be [batch] = {(b,)} (one per sequence), got {jnp.shape(advantages)}; flatten group "
            f"advantages with .reshape(-1) in the same order as the rows of logprobs."
        )
    for name, x in {"logprobs": logprobs, "advantages": advantages, "mask": mask, **named}.items():
        check_real(x, name)
    if ref_logprobs is None and is_concrete(beta) and float(beta) != 0.0:
        raise ValueError(f"beta={beta} needs ref_logprobs for the KL term; pass reference log-probs or beta=0.")
    if is_concrete(eps_low) and is_concrete(eps_high) and not (0.0 <= float(eps_low) < 1.0 and float(eps_high) >= 0):
        raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got eps_low={eps_low}, eps_high={eps_high}.")
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise ValueError(f"max_len must be a positive int (the Dr.GRPO normaliser), got {max_len!r}.")
    norm = float(t if max_len is None else max_len)
    ref = ref_logprobs if ref_logprobs is not None else logprobs  # unused placeholder when has_ref is False
    return _grpo_loss(
        jnp.asarray(logprobs), jnp.asarray(old_logprobs), jnp.asarray(ref), jnp.asarray(advantages),
        jnp.asarray(mask), jnp.asarray(eps_low), jnp.asarray(eps_high), jnp.asarray(beta), jnp.asarray(norm),
        aggregation=aggregation, has_ref=ref_logprobs is not None, loss=loss,
    )


# How the learner combines the loss's metrics over micro-batches (`rrc_jax.rl.learner`): token means weighed by
# their tokens, the token count summed, the ratio's extremes as extremes; `policy_loss` as the loss.
METRIC_REDUCTIONS = {**{k: "num_tokens" for k in ("kl", "entropy", "clip_fraction", "clip_low_fraction",
                                                  "clip_high_fraction", "ratio_mean")},
                     "num_tokens": "sum", "ratio_min": "min", "ratio_max": "max"}


def grpo_objective(*, temperature: float = 1.0, eps_low: float = 0.2, eps_high: float = 0.2, beta: float = 0.0,
                   aggregation: str = "seq_mean_token_mean", max_len: int | None = None, chunk_size: int = 128,
                   remat: bool = False, loss: str = "grpo"):
    """The GRPO loss of a policy on a rollout batch, as a `rrc_jax.rl.learner` loss function.

    The batch holds `ids`, `mask`, `loss_mask` `[B, T]`, `advantages [B]`, `old_logp [B, T]`, when `beta > 0`
    `ref_logp [B, T]`, and under LoRA dropout each row's seed `dropout_seed [B]`; without `old_logp` the batch is on-policy (each rollout's one update, the first after its
    sampling) and pi_theta_old is the policy itself, `stop_gradient(logp)`, as in Eq. 4 with one inner iteration; every log-probability is of `softmax(logits / temperature)`, the distribution the rollouts
    were sampled from. `max_len` is Dr.GRPO's constant (the generation budget, `rl.max_new_tokens`). The metrics
    add the policy's mean token `entropy` and the learner's `weight` (`aggregation_weight`). `chunk_size` positions
    of the LM head at a time and `remat` (recompute each block in the backward pass) bound the memory of the
    forward pass (`Decoder.token_logprobs`). `loss`: the importance ratio (`LOSSES`, `Loss.log_ratio`).
    """
    check_option(aggregation, AGGREGATIONS, "aggregation")
    check_option(loss, LOSSES, "loss")

    def loss_fn(model, batch):
        logp, entropy = model.token_logprobs(batch["ids"], batch["mask"], return_entropy=True,
                                             temperature=temperature, chunk_size=chunk_size, remat=remat,
                                             dropout_seed=batch.get("dropout_seed"))
        old = batch["old_logp"] if "old_logp" in batch else jax.lax.stop_gradient(logp)  # on-policy: rho = 1
        value, metrics = grpo_loss(logp, old, batch.get("ref_logp"), batch["advantages"],
                                   batch["loss_mask"], eps_low=eps_low, eps_high=eps_high, beta=beta,
                                   aggregation=aggregation, max_len=max_len, loss=loss)
        w = batch["loss_mask"].astype(jnp.float32)
        metrics["entropy"] = jax.lax.stop_gradient((entropy * w).sum() / jnp.maximum(w.sum(), 1.0))
        metrics["weight"] = aggregation_weight(batch["loss_mask"], aggregation)
        return value, metrics

    loss_fn.reductions = METRIC_REDUCTIONS
    return loss_fn
