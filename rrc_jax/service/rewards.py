"""The reward service's judge: a cohort's rewards from a construction of the registry (`GroupRewards`: SCR's win
counts, CARA, AGR's anchors beaten, PRC, a tournament's standing) and its judge, the cohorts of one call judged in
as few construction calls as their sizes allow (whole cohorts share one; an expired cohort of k < G rollouts is
judged as a group of k).

A construction that reads a prompt's columns gets them from the service: AGR's anchors (`anchors`: prompt -> its
reference responses) and PRC's reference (`references`: prompt -> o_ref). A prompt without them fails its cohort
with an error naming it.

Shapes: C cohorts a call, k rollouts a cohort.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rrc_jax.integrations.groups import GroupRewards, Row
from rrc_jax.service.cohorts import Answer, Cohort


def cohort_rewards(rewards: GroupRewards, *, anchors: Mapping[str, Sequence[str]] | None = None,
                   references: Mapping[str, str] | None = None):
    """`reward_cohorts(cohorts) -> answers` (`rrc_jax.service.app.RewardCohorts`) over `rewards`."""
    anchors, references = anchors or {}, references or {}

    def row(prompt: str, completion: str) -> Row:
        if "anchors" in rewards.columns and not anchors.get(prompt):
            raise KeyError(f"no anchors for prompt {prompt[:80]!r}: {rewards.kind} needs each prompt's anchors")
        if "reference" in rewards.columns and not references.get(prompt):
            raise KeyError(f"no reference for prompt {prompt[:80]!r}: {rewards.kind} needs each prompt's o_ref")
        return Row(prompt, completion, tuple(anchors.get(prompt, ())), references.get(prompt, ""))

    def reward_cohorts(cohorts: list[Cohort]) -> list[list[Answer]]:
        answers: list[list[Answer]] = [[] for _ in cohorts]
        by_size: dict[int, list[int]] = {}
        for i, c in enumerate(cohorts):
            by_size.setdefault(len(c.rollouts), []).append(i)
        for k, members in by_size.items():
            ready, rows = [], []
            for i in members:
                try:
                    rows += [row(r.prompt, r.completion) for r in cohorts[i].rollouts]
                    ready.append(i)
                except KeyError as e:  # this cohort fails; the others of its size are judged
                    answers[i] = [Answer(error=str(e.args[0]))] * k
                    del rows[len(ready) * k:]
            if not ready:
                continue
            values = rewards(rows, group_size=k)
            for j, i in enumerate(ready):
                answers[i] = [Answer(reward=float(v)) for v in values[j * k:(j + 1) * k]]
        return answers

    return reward_cohorts
