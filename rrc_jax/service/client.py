"""A trainer's side of the reward service: `ServedRewards`, `GroupRewards`' interface over `POST /v1/rewards`, so
that the TRL and tunix reward functions take the service's URL where they take a judge.

A call posts its whole groups as one request (`rrc_jax.service.remote.post_rewards`), each group a group id of its
own and each rollout a request id (the call's uuid and its index), and retries the same request on a connection
error or a 5xx: the service counts each rollout once. The service's recipe is the reward (its kind, settings, judge
and anchors).

Shapes: N rollouts a call (whole groups of G).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np

from rrc_jax.integrations.groups import Row, check_groups
from rrc_jax.service.remote import post_rewards


class ServedRewards:
    """Rewards `[N]` of whole groups from the reward service at `url` (`http://host:port`); `group_size` is G,
    `api_key` the service's bearer token. `columns` is empty: the service holds AGR's anchors."""

    columns: tuple[str, ...] = ()

    def __init__(self, url: str, *, group_size: int, api_key: str = "", timeout_s: float = 900.0, retries: int = 3):
        if group_size < 2:
            raise ValueError(f"group_size={group_size}: a GRPO group needs at least 2 completions")
        self.url, self.group_size, self.api_key = url.rstrip("/"), group_size, api_key
        self.timeout_s, self.retries = timeout_s, retries
        self.kind, self.last_metrics = "served", {}

    def __call__(self, rows: Sequence[Row], step: int | None = None, *, group_size: int | None = None) -> np.ndarray:
        g = self.group_size if group_size is None else group_size
        check_groups(rows, g)
        call = uuid.uuid4().hex
        answer = post_rewards(self.url, [{"prompt": r.prompt, "completion": r.completion, "group_size": g,
                                          "group": f"{call}/{i // g}", "request_id": f"{call}/{i}"}
                                         for i, r in enumerate(rows)],
                              api_key=self.api_key, timeout_s=self.timeout_s, retries=self.retries)
        errors = [e for e in answer.get("errors") or [] if e]
        if errors:
            raise RuntimeError(f"the reward service at {self.url} failed {len(errors)} of {len(rows)} rollouts: "
                               f"{errors[0]}")
        self.last_metrics = {}
        return np.asarray(answer["rewards"], np.float32)
