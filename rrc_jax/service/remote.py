"""A trainer's calls to the reward service, with nothing but the standard library, so that a trainer's environment
loads this file by its path without installing rrc_jax (verl's `custom_reward_function.path`).

* `post_rewards(url, rollouts, ...)`: one `POST /v1/rewards`, the same request retried on a connection error or a
  5xx (its request ids make the retry count each rollout once); the answer's JSON.
* `compute_score(...)`: verl's reward function (its reward loop awaits an async one, a rollout a call, every
  rollout of a batch at once): the rollout's reward from the service, its group the prompt's rollouts.

    custom_reward_function.path=$(python -c 'import rrc_jax.service.remote as m; print(m.__file__)')
    custom_reward_function.name=compute_score
    +custom_reward_function.reward_kwargs.url=http://judge:8100
    +custom_reward_function.reward_kwargs.group_size=8          # actor_rollout_ref.rollout.n

verl hands a reward function the response and the dataset row's `extra_info`, not the prompt: the prompt is
`extra_info[prompt_key]` (default `question`, where verl's data preprocessing examples put it).

Shapes: R rollouts a request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence

# A rollout waits in a thread until its group is whole; a batch's rollouts wait together (up to this many)
_WAITING = concurrent.futures.ThreadPoolExecutor(4096, thread_name_prefix="rrc-reward")


def post_rewards(url: str, rollouts: Sequence[dict], *, api_key: str = "", timeout_s: float = 900.0,
                 retries: int = 3, wait_s: float = 0.0, progress=None) -> dict:
    """`{"rewards", "cohorts", "errors"?, "judge"?}` of the service at `url` (`http://host:port`) for `rollouts` (R
    dicts of the request's fields). Retries the same request `retries` times on a connection error or a 5xx
    (waiting 1, 2, 4... s, at most 10), and on a connection error for `wait_s` seconds at least (a service
    restarting), telling `progress(line)` (when given) each time it waits; a `RuntimeError` naming the service and
    its answer otherwise."""
    data = json.dumps({"rollouts": list(rollouts)}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    url = url.rstrip("/")
    deadline, attempt = time.monotonic() + wait_s, 0
    while True:
        request = urllib.request.Request(url + "/v1/rewards", data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read() or b"{}").get("error", {}).get("message", "")
            except ValueError:
                message = ""
            if e.code < 500 or attempt >= retries:
                raise RuntimeError(f"the reward service at {url} answered {e.code}: {message}") from None
            why = f"it answered {e.code}"
        except (urllib.error.URLError, OSError) as e:
            left = deadline - time.monotonic()
            if attempt >= retries and left <= 0:
                raise RuntimeError(f"the reward service at {url} did not answer: {e}") from None
            why = f"it did not answer ({getattr(e, 'reason', e)}); waiting up to {max(left, 0):.0f} s more"
        pause = min(2 ** attempt, 10)
        if progress is not None:
            progress(f"the reward service at {url}: {why}; asking again in {pause} s")
        time.sleep(pause)  # the same request again: its rollouts are counted once
        attempt += 1


async def compute_score(data_source: str, solution_str: str, ground_truth=None, extra_info: dict | None = None, *,
                        url: str, group_size: int, api_key: str = "", prompt_key: str = "question",
                        timeout_s: float = 900.0, retries: int = 3, **unused) -> float:
    """verl's reward of one rollout (`solution_str`, the decoded response) from the reward service at `url`: its
    group is the prompt `extra_info[prompt_key]` with `group_size` rollouts (verl's `rollout.n`), and the call
    returns once the group is whole and judged. `data_source` and `ground_truth` are not read (the judge needs
    no label); verl's other keywords (`reward_router_address`, ...) are ignored."""
    if not isinstance(extra_info, dict) or not isinstance(extra_info.get(prompt_key), str):
        raise KeyError(f"extra_info[{prompt_key!r}]: the prompt's text is needed to group and judge a rollout; put it "
                       "in the dataset's extra_info, or name its key with reward_kwargs.prompt_key")
    rollout = {"prompt": extra_info[prompt_key], "completion": solution_str, "group_size": int(group_size),
               "request_id": uuid.uuid4().hex}
    answer = await asyncio.get_running_loop().run_in_executor(
        _WAITING, lambda: post_rewards(url, [rollout], api_key=api_key, timeout_s=timeout_s, retries=retries))
    error = (answer.get("errors") or [None])[0]
    if error:
        raise RuntimeError(f"the reward service at {url} failed the rollout: {error}")
    return float(answer["rewards"][0])
