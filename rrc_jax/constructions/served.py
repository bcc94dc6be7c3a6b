"""A construction whose judging happens in a reward service (`python -m rrc_jax.service`): the trainer's rewards of
`reward.kind` come from the service at `reward.service_url`, so that the GRM never loads in the trainer and one
judge (or a pool behind it) serves several trainers.

`served(cls)` is the run's construction class when `reward.service_url` is set: the kind, settings and rules of
`cls` (a kind that rewards another trainer's groups, `Construction.of_groups`, reading no column or AGR's anchors),
without its judge. The service's recipe judges: start it with the same config (`python -m rrc_jax.service
--config=agr.py ...`). Before anything loads the trainer asks the service for its recipe (`GET /v1/recipe`,
waiting up to `reward.service_wait_s` for it to answer, its progress shown) and refuses one that is not the run's
(`recipe`: the kind and its settings, the group size, the judge's settings and the GRM's `checkpoint_identity`),
naming the first difference.

Each draw of a step (dynamic sampling draws again) posts its B groups to `POST /v1/rewards` as one request: group
`run/step/draw/host/b`, request ids `run/step/draw/host/b/i`, where `run` is the run's own id (drawn at its start,
kept in the workdir: a resume asks with the same ids, a new run in the same workdir with new ones), and the judge's
`seed`, the step's (`step_seed`, as in process): the service judges the request's groups together from it, so the
rewards are a function of the request, whatever else the service judges and across its restarts. AGR's anchors go
with each rollout (the run's anchor store, sampled from the reference as in process). A service that does not
answer is asked again for `reward.service_wait_s` seconds (a restart), the wait shown; one that stays away, or
fails the request's rollouts (its judge down), stops the run (`Diverged`: one line naming the cause; a rerun
resumes from the last checkpoint). A bearer token comes from
`$RRC_API_KEY` (never written into the run's config). The judge's counters of the calls that judged a request come
back with it and are logged as the step's `judge/*`.

What the trainer then does not have: the judgments behind the rewards (samples carry the anchors only) and a
judged held-out evaluation (`eval.judge_votes` must be 0; the oracle's quality is measured as ever). Greedy, the
rewards are the in-process construction's (`tests/test_serve.py`).

Shapes: B prompts a step on this host, m responses a prompt, n anchors a prompt.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from typing import ClassVar

import jax
import numpy as np
from etils import epath

from rrc_jax import distributed
from rrc_jax.checkpoint import steps_on_disk
from rrc_jax.constructions.agr import anchor_store
from rrc_jax.constructions.base import Construction, JudgeLoad, RewardResult, step_seed
from rrc_jax.errors import ConfigError, Diverged
from rrc_jax.models.hf_io import checkpoint_identity
from rrc_jax.progress import say
from rrc_jax.service.remote import post_rewards

RUN_ID_FILE = "service_run_id"  # in the workdir: the run's id in its requests (module docstring)


def recipe(s, kind: str | None = None) -> dict:
    """What a reward service's rewards are, from a trainer config's settings `s` (JSON): the kind, its settings
    (`reward.<kind>`), the group size, the judge's settings that change its judgments and the GRM's
    `checkpoint_identity`. A trainer's own and its service's must be equal (`ServedReward.preflight`)."""
    from rrc_jax.rl.roles import Roles  # (the GRM's directory; no model loads)

    kind = kind or s.reward_kind
    settings = s.constructions.get(kind)
    j = s.judge
    judge = {"template": str(j.template), "max_new_tokens": j.max_new_tokens, "temperature": j.temperature,
             "top_p": j.top_p, "top_k": j.top_k, "votes": j.votes, "swap": j.swap, "force_verdicts": j.force_verdicts}
    return json.loads(json.dumps({
        "kind": kind, "settings": dataclasses.asdict(settings) if settings is not None else {},
        "group_size": s.rollout.group_size, "judge": judge,
        "grm": checkpoint_identity(Roles.of_run(s).path("grm"))}, default=str))


def recipe_difference(ours: dict, theirs: dict, where: str = "") -> str | None:
    """The first field where two recipes differ, as `name: ours vs theirs`; None when they are equal. A field one
    side cannot know ("": the GRM's weights where its directory holds none) is not compared."""
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name, "(none)"), theirs.get(name, "(none)")
        if isinstance(a, dict) and isinstance(b, dict):
            found = recipe_difference(a, b, f"{where}{name}.")
            if found:
                return found
        elif a != b and "" not in (a, b):
            return f"{where}{name}: this run's {a!r}, the service's {b!r}"
    return None


def get_json(url: str, path: str, *, api_key: str = "", timeout_s: float = 10.0):
    """`GET url + path`'s JSON; an `OSError` (a `urllib.error.URLError`, an `HTTPError`) when it does not answer."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=timeout_s) as answer:
        return json.loads(answer.read())


def wait_for_service(url: str, *, api_key: str = "", wait_s: float = 60.0, poll_s: float = 2.0,
                     clock=time.monotonic, sleep=time.sleep) -> dict:
    """The recipe of the reward service at `url` (`GET /v1/recipe`), asked until it answers or `wait_s` seconds
    passed (one line of progress each `poll_s` s it does not); a one-line `ConfigError` naming the service, what
    came back and the fix otherwise."""
    deadline, said = clock() + wait_s, False
    while True:
        try:
            return get_json(url, "/v1/recipe", api_key=api_key)
        except urllib.error.HTTPError as e:  # it answers: not with a recipe
            hint = ("set $RRC_API_KEY to the service's --api_key" if e.code == 401 else
                    "is config.reward.service_url a reward service (python -m rrc_jax.service) of this version?")
            raise ConfigError(f"config.reward.service_url: {url}/v1/recipe answered HTTP {e.code}; {hint}") from None
        except (OSError, ValueError) as e:
            left = deadline - clock()
            if left <= 0:
                raise ConfigError(f"config.reward.service_url: the reward service at {url} did not answer within "
                                  f"{wait_s:g} s ({getattr(e, 'reason', e)}); start it (python -m rrc_jax.service "
                                  "--config=<this run's config>) or raise reward.service_wait_s") from None
            if not said:
                say(f"waiting up to {wait_s:g} s for the reward service at {url} ({getattr(e, 'reason', e)})")
                said = True
            else:
                say(f"  still waiting for {url}: {left:.0f} s left")
            sleep(min(poll_s, max(left, 0.0)))


def run_id(workdir: epath.Path) -> str:
    """The run's id in its requests: kept in `workdir/service_run_id` while the workdir holds a checkpoint to
    resume from, drawn anew (and written) otherwise. Process 0's, on every host."""
    number = 0
    if distributed.is_main():
        path = workdir / RUN_ID_FILE
        kept = path.read_text().strip() if path.is_file() and steps_on_disk(workdir / "checkpoints") else ""
        number = int(kept, 16) if len(kept) == 16 and all(c in "0123456789abcdef" for c in kept) else 0
        if not number:
            number = secrets.randbits(63) or 1
            workdir.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{number:016x}\n")
    return f"{int(distributed.main_value(np.int64(number))):016x}"


class ServedReward(Construction):
    """Rewards of `wrapped`'s kind from a reward service (module docstring)."""

    wrapped: ClassVar[type[Construction]]

    def __init__(self, url: str, run: str, *, seed: int = 0, store=None, api_key: str = "", wait_s: float = 60.0):
        self.url, self.run, self.seed, self.store, self.api_key, self.wait_s = url, run, seed, store, api_key, wait_s
        self._draws: dict[int, int] = {}  # step -> its draws asked so far (dynamic sampling draws again)
        self._lock = threading.Lock()  # (the asynchronous step judges from a thread of its own)

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
        if getattr(s.reward_settings, "refresh_every", 0):
            raise ConfigError(f"config.reward.{kind}.refresh_every: refreshed anchors are sampled in process; a served "
                              "reward judges against the reference's (set it to 0)")
        if s.eval.judge_votes:
            raise ConfigError("config.eval.judge_votes: a judged evaluation needs the judge in this process; with "
                              "reward.service_url set it to 0 (the oracle's quality is still measured)")
        cls.wrapped.check(s)

    @classmethod
    def preflight(cls, s) -> None:
        """Before anything loads: the service answers (waiting up to `reward.service_wait_s`) with the run's own
        recipe (`recipe`), else a one-line `ConfigError` naming the first difference."""
        theirs = wait_for_service(s.reward_service, api_key=os.environ.get("RRC_API_KEY", ""),
                                  wait_s=s.reward_service_wait_s)
        difference = recipe_difference(recipe(s), theirs if isinstance(theirs, dict) else {})
        if difference:
            raise ConfigError(f"config.reward.service_url: the reward service at {s.reward_service} serves another "
                              f"recipe ({difference}); start it with this run's config (python -m rrc_jax.service "
                              "--config=...) or point the run at one that does")

    @classmethod
    def from_settings(cls, s, ctx) -> ServedReward:
        store = None
        if cls.columns:  # AGR's anchors: the reference's samples, as in process (`AGRReward`)
            store = anchor_store(s, ctx.train, ctx.tokenizer)
            if not distributed.main_value(store.path.is_file()):
                store.generate(ctx.reference(), s.seed)
            store.load()
        run = run_id(epath.Path(s.workdir).expanduser())
        return cls(s.reward_service, run, seed=s.seed, store=store, api_key=os.environ.get("RRC_API_KEY", ""),
                   wait_s=s.reward_service_wait_s)

    def prepare(self, prompts, prompt_index, step) -> dict[str, list]:
        return {"anchors": self.store[prompt_index]} if self.store is not None else {}

    def construct(self, prompts, responses, prompt_index, step, *, anchors=None) -> RewardResult:
        given, anchors = anchors is not None, anchors if anchors is not None else [[] for _ in prompts]
        with self._lock:  # draw d of the step: its d-th request (a resumed step asks its draws again, in order)
            draw = self._draws[step] = self._draws.get(step, -1) + 1
        m, host, seed = len(responses[0]), jax.process_index(), step_seed(self.seed, step)
        name = f"{self.run}/{step}/{draw}/{host}"
        rollouts = [{"prompt": p, "completion": r, "group_size": m, "group": f"{name}/{b}",
                     "request_id": f"{name}/{b}/{i}", "anchors": list(a), "seed": seed}
                    for b, (p, group, a) in enumerate(zip(prompts, responses, anchors)) for i, r in enumerate(group)]
        rerun = "rerun once it answers again: the run resumes from its last checkpoint"
        try:
            answer = post_rewards(self.url, rollouts, api_key=self.api_key, wait_s=self.wait_s, progress=say)
        except RuntimeError as e:
            raise Diverged(f"step {step}: {e}; {rerun}") from None
        errors = [e for e in answer.get("errors") or [] if e]
        if errors:
            raise Diverged(f"step {step}: the reward service at {self.url} failed {len(errors)} of {len(rollouts)} "
                           f"rollouts ({errors[0]}); {rerun}")
        rewards = np.asarray(answer["rewards"], np.float32).reshape(len(prompts), m)
        metrics = {k: float(v) for k, v in (answer.get("judge") or {}).items()
                   if isinstance(v, (int, float)) and k.startswith("judge/")}
        return RewardResult(rewards, metrics, notes=[{"anchors": list(a)} for a in anchors] if given else [])


def served(cls: type[Construction]) -> type[ServedReward]:
    """`cls`'s kind, settings and rules, its rewards from a reward service (module docstring)."""
    return type(f"Served{cls.__name__}", (ServedReward,), {
        "wrapped": cls, "kind": cls.kind, "Settings": cls.Settings, "baseline": cls.baseline, "columns": cls.columns,
        "__doc__": f"{cls.kind}'s rewards from a reward service (`rrc_jax.constructions.served`)."})

