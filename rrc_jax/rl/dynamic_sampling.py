"""DAPO's dynamic sampling ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale", section 3.2): a
step trains on prompts_per_step groups whose rewards are not all equal.

A group whose m rewards are equal has zero advantages under every estimator (`rrc_jax.rl.grpo.group_advantages`):
it costs a forward and backward pass and moves nothing. With `rl.dynamic_sampling`, the trainer draws another batch
of prompts (the next of the grain pipeline, so a resume replays the same draws), samples and rewards it, until the
step has B informative groups or `rl.max_draws` batches were drawn; the batch is then the first B informative groups
in draw order, topped up with constant groups (zero advantage) if the draws ran out. Nothing is dropped silently:
`data/draws_per_step`, `data/filtered_groups` (constant groups left out), `data/surplus_groups` (informative groups
beyond B) and `data/unfilled_groups` (constant groups kept because the draws ran out) are logged.

On several hosts each host keeps its own B / hosts groups; every host draws until every host is full (the sampler
and the judge are collective), so the hosts draw in step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from rrc_jax import distributed
from rrc_jax.constructions import RewardResult
from rrc_jax.rl.rollout import Groups


@dataclasses.dataclass(frozen=True)
class Draw:
    """One batch of prompts drawn for a step: `prompt_index [B]` into the training prompts, their texts, sampled
    `groups`, the construction's `result` and the rewards trained on `[B, m]` (`result.rewards`, shaped); the
    seconds spent sampling and rewarding, and the tokens sampled."""

    prompt_index: np.ndarray
    prompts: list[str]
    groups: Groups
    result: RewardResult
    rewards: np.ndarray
    rollout_seconds: float = 0.0
    reward_seconds: float = 0.0
    sampled_tokens: int = 0


def informative(rewards: np.ndarray) -> np.ndarray:
    """`[B]` bool: the groups of `rewards [B, m]` whose rewards are not all equal (DAPO's Eq. 11 filter, on rewards)."""
    rewards = np.asarray(rewards)
    return rewards.max(axis=1) != rewards.min(axis=1)


def merge_metrics(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """The construction metrics of several draws as one step's: totals (`distributed.SUMMED_METRICS`: questions,
    tokens) summed, the rest averaged over the draws (each draw has B groups)."""
    keys = parts[0].keys()
    return {k: float(np.sum([p[k] for p in parts])) if distributed.summed(k)
            else float(np.nanmean([p[k] for p in parts])) if any(np.isfinite(p[k]) for p in parts) else float("nan")
            for k in keys}


def select(draws: Sequence[Draw], picks: Sequence[tuple[int, int]]) -> Draw:
    """One `Draw` of the groups `picks` ((draw, group) pairs, in order): their prompts, groups, rewards, notes and
    judgments (renumbered to their place in the new batch); the metrics, seconds and tokens of every draw
    (`merge_metrics`)."""
    place = {pick: b for b, pick in enumerate(picks)}
    judgments = [{**j, "prompt": place[(d, j["prompt"])]} for d, draw in enumerate(draws)
                 for j in draw.result.judgments if (d, j["prompt"]) in place]
    notes = [draws[d].result.notes[g] for d, g in picks] if all(draw.result.notes for draw in draws) else []
    result = RewardResult(np.stack([draws[d].result.rewards[g] for d, g in picks]),
                          merge_metrics([draw.result.metrics for draw in draws]), judgments, notes)
    return Draw(np.array([draws[d].prompt_index[g] for d, g in picks]), [draws[d].prompts[g] for d, g in picks],
                Groups.concat([draws[d].groups.take([g]) for d, g in picks]), result,
                np.stack([draws[d].rewards[g] for d, g in picks]), sum(x.rollout_seconds for x in draws),
                sum(x.reward_seconds for x in draws), sum(x.sampled_tokens for x in draws))


def fill(draw: Callable[[int], Draw], max_draws: int) -> tuple[Draw, dict[str, float]]:
    """Draw batches (`draw(i)`, i = 0, 1, ...) until this host and every other has B informative groups (B: the
    first draw's size) or `max_draws` were drawn; returns the step's `Draw` of B groups and the `data/*` counts."""
    draws = [draw(0)]
    b, found = len(draws[0].prompts), int(informative(draws[0].rewards).sum())
    while len(draws) < max_draws and distributed.any_host(found < b):
        draws.append(draw(len(draws)))
        found += int(informative(draws[-1].rewards).sum())
    good = [(d, g) for d, x in enumerate(draws) for g in np.flatnonzero(informative(x.rewards))]
    flat = [(d, g) for d, x in enumerate(draws) for g in np.flatnonzero(~informative(x.rewards))]
    picks = good[:b] + flat[:max(0, b - len(good))]
    kept_flat = max(0, b - len(good))
    return select(draws, [(d, int(g)) for d, g in picks]), {
        "data/draws_per_step": float(len(draws)), "data/filtered_groups": float(len(flat) - kept_flat),
        "data/surplus_groups": float(max(0, len(good) - b)), "data/unfilled_groups": float(kept_flat)}
