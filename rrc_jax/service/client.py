"""A trainer's side of the reward service: `ServedRewards`, `GroupRewards`' interface over `POST /v1/rewards`, so
that the TRL and tunix reward functions take the service's URL where they take a judge.

A call posts its whole groups as one request (`rrc_jax.service.remote.post_rewards`), each group a group id of its
own and each rollout a request id (the call's uuid and its index), and the judge's seed (from `seed` and the
trainer's step, or the call's number, as `GroupRewards` reseeds in process: the same call gets the same rewards
whatever else the service judges), and retries the same request on a connection error or a 5xx: the service counts
each rollout once. The service's recipe is the reward (its kind, settings, judge and anchors); the judge's counters
of the call come back as `last_metrics`.

Shapes: N rollouts a call (whole groups of G).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np

from rrc_jax.constructions.base import step_seed
from rrc_jax.integrations.groups import Row, check_groups
from rrc_jax.service.remote import post_rewards


class ServedRewards:
    """Rewards `[N]` of whole groups from the reward service at `url` (`http://host:port`); `group_size` is G,
    `api_key` the service's bearer token. `columns` is empty: the service holds AGR's anchors."""

    columns: tuple[str, ...] = ()

    def __init__(self, url: str, *, group_size: int, api_key: str = "", timeout_s: float = 900.0, retries: int = 3,
                 seed: int = 0):
        if group_size < 2:
            raise ValueError(f"group_size={group_size}: a GRPO group needs at least 2 completions")
        self.url, self.group_size, self.api_key, self.seed = url.rstrip("/"), group_size, api_key, seed
        self.timeout_s, self.retries, self.calls = timeout_s, retries, 0
        self.kind, self.last_metrics = "served", {}

    def __call__(self, rows: Sequence[Row], step: int | None = None, *, group_size: int | None = None) -> np.ndarray:
        g = self.group_size if group_size is None else group_size
        check_groups(rows, g)
        call, seed = uuid.uuid4().hex, step_seed(self.seed, self.calls if step is None else step)
        self.calls += 1
        answer = post_rewards(self.url, [{"prompt": r.prompt, "completion": r.completion, "group_size": g,
                                          "group": f"{call}/{i // g}", "request_id": f"{call}/{i}", "seed": seed}
                                         for i, r in enumerate(rows)],
                              api_key=self.api_key, timeout_s=self.timeout_s, retries=self.retries)
        errors = [e for e in answer.get("errors") or [] if e]
        if errors:
            raise RuntimeError(f"the reward service at {self.url} failed {len(errors)} of {len(rows)} rollouts: "
                               f"{errors[0]}")
        self.last_metrics = {k: float(v) for k, v in (answer.get("judge") or {}).items() if v is not None}
        return np.asarray(answer["rewards"], np.float32)
