"""A construction whose judging happens in a reward service (`python -m rrc_jax.service`): the trainer's rewards of
`reward.kind` come from the service at `reward.service_url`, so that the GRM never loads in the trainer and one
judge (or a pool behind it) serves several trainers.

`served(cls)` is the run's construction class when `reward.service_url` is set: the kind, settings and rules of
`cls` (a kind that rewards another trainer's groups, `Construction.of_groups`, reading no column or AGR's anchors),
without its judge. Each step posts its B groups to `POST /v1/rewards` as one request: group `run/step/host/b`,
request ids `run/step/host/b/i` (a retry, or a resumed step asking again, counts each rollout once), AGR's anchors
with each rollout (the run's anchor store, sampled from the reference as in process). The service's recipe judges:
start it with the same config (`python -m rrc_jax.service --config=agr.py ...`), whose `reward.kind`, judge
settings and GRM are the reward; the run's `reward.judge` and GRM are not read. A bearer token comes from
`$RRC_API_KEY` (never written into the run's config).

What the trainer then does not have: the judge's own metrics (`judge/*`: the service's `GET /health` counts its
work), the judgments behind the rewards (samples carry the anchors only) and a judged held-out evaluation
(`eval.judge_votes` must be 0; the oracle's quality is measured as ever). Greedy, the rewards are the in-process
construction's (`tests/test_serve.py`).

Shapes: B prompts a step on this host, m responses a prompt, n anchors a prompt.
"""

from __future__ import annotations

import hashlib
import os
from typing import ClassVar

import jax
import numpy as np
from etils import epath

from rrc_jax import distributed
from rrc_jax.constructions.agr import anchor_store
from rrc_jax.constructions.base import Construction, JudgeLoad, RewardResult
from rrc_jax.errors import ConfigError
from rrc_jax.service.remote import post_rewards


class ServedReward(Construction):
    """Rewards of `wrapped`'s kind from a reward service (module docstring)."""

    wrapped: ClassVar[type[Construction]]

    def __init__(self, url: str, run: str, *, store=None, api_key: str = ""):
        self.url, self.run, self.store, self.api_key = url, run, store, api_key

    @classmethod
    def roles(cls, s) -> frozenset[str]:
        return cls.wrapped.roles(s) - {"grm"}  # the judge is the service's

    @classmethod
    def judge_load(cls, s) -> JudgeLoad:
        return JudgeLoad(0, 0)  # (the service's: docs/planner.md counts its chips)

    @classmethod
    def absolute_scale(cls, s) -> bool | None:
        return cls.wrapped.absolute_scale(s)

    @classmethod
    def check(cls, s) -> None:
        kind = cls.kind
        if cls.wrapped.of_groups.__func__ is Construction.of_groups.__func__:
            raise ConfigError(f"config.reward.service_url: reward.kind={kind!r} rewards in this trainer only; a reward "
                              "service serves the kinds that reward groups (rrc_jax.constructions.group_kinds)")
        if set(cls.columns) - {"anchors"}:
            raise ConfigError(f"config.reward.service_url: reward.kind={kind!r} reads {', '.join(cls.columns)} per "
                              "prompt, which a trainer does not send the service; give them to the service "
                              "(--anchors) and use its rewards from another trainer's reward function")
        if kind == "agr" and s.reward_settings.refresh_every:
            raise ConfigError("config.reward.agr.refresh_every: refreshed anchors are sampled in process; a served "
                              "reward judges against the reference's (set it to 0)")
        if s.eval.judge_votes:
            raise ConfigError("config.eval.judge_votes: a judged evaluation needs the judge in this process; with "
                              "reward.service_url set it to 0 (the oracle's quality is still measured)")
        cls.wrapped.check(s)

    @classmethod
    def from_settings(cls, s, ctx) -> ServedReward:
        store = None
        if cls.columns:  # AGR's anchors: the reference's samples, as in process (`AGRReward`)
            store = anchor_store(s, ctx.train, ctx.tokenizer)
            if not distributed.main_value(store.path.is_file()):
                store.generate(ctx.reference(), s.seed)
            store.load()
        workdir = str(epath.Path(s.workdir).expanduser().resolve())
        run = hashlib.sha256(f"{workdir}:{s.seed}".encode()).hexdigest()[:16]
        return cls(s.reward_service, run, store=store, api_key=os.environ.get("RRC_API_KEY", ""))

    def prepare(self, prompts, prompt_index, step) -> dict[str, list]:
        return {"anchors": self.store[prompt_index]} if self.store is not None else {}

    def construct(self, prompts, responses, prompt_index, step, *, anchors=None) -> RewardResult:
        given, anchors = anchors is not None, anchors if anchors is not None else [[] for _ in prompts]
        m, host = len(responses[0]), jax.process_index()
        rollouts = [{"prompt": p, "completion": r, "group_size": m, "group": f"{self.run}/{step}/{host}/{b}",
                     "request_id": f"{self.run}/{step}/{host}/{b}/{i}", "anchors": list(a)}
                    for b, (p, group, a) in enumerate(zip(prompts, responses, anchors)) for i, r in enumerate(group)]
        answer = post_rewards(self.url, rollouts, api_key=self.api_key)
        errors = [e for e in answer.get("errors") or [] if e]
        if errors:
            raise RuntimeError(f"step {step}: the reward service at {self.url} failed {len(errors)} of "
                               f"{len(rollouts)} rollouts: {errors[0]}")
        rewards = np.asarray(answer["rewards"], np.float32).reshape(len(prompts), m)
        return RewardResult(rewards, notes=[{"anchors": list(a)} for a in anchors] if given else [])


def served(cls: type[Construction]) -> type[ServedReward]:
    """`cls`'s kind, settings and rules, its rewards from a reward service (module docstring)."""
    return type(f"Served{cls.__name__}", (ServedReward,), {
        "wrapped": cls, "kind": cls.kind, "Settings": cls.Settings, "baseline": cls.baseline, "columns": cls.columns,
        "__doc__": f"{cls.kind}'s rewards from a reward service (`rrc_jax.constructions.served`)."})

