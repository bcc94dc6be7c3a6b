"""Other trainers' remote-reward requests, read as the service's rollouts and answered as each trainer reads them.

Each protocol is a pair: `parse(body, group_size) -> rollouts` (a `BadRequest` naming the field) and
`answer(rewards) -> JSON`. Neither sends a group id or a group size: a rollout's group is its prompt and G is the
service's (`rl.group_size` of its recipe: the trainer's samples per prompt). Neither sends a request id either, so
a client's retry of a request the service had taken is a new rollout: keep `--cohort_timeout_s` below the client's
timeout, so that a request is answered before its client gives up on it.

* `openrlhf`: OpenRLHF's `--reward.remote_url` (`SingleTurnAgentExecutor._fetch_rewards_via_http`, before it
  `remote_rm_fn`): `{"query": [prompt + response, ...], "prompts": [...], "labels": [...]}`, one rollout a request
  (the whole batch in its older releases; the URLs after the first get empty lists), answered
  `{"rewards": [...], "scores": [...], "extra_logs": {}}`. The completion is the query after its prompt.
* `slime`: slime's `--rm-type remote_rm --rm-url` (`rm_hub.remote_rm`): `{"prompt", "response", "label"}`, one
  rollout a request, answered with the bare reward (a JSON number). A prompt given as chat messages is their
  `role: content` lines.
* `nemo_gym`: NeMo Gym's resources-server verify call (`POST /verify`, `BaseVerifyRequest`): the Responses API's
  `responses_create_params` (its `input`: a text or messages) and `response` (its `output` items; the completion
  is the assistant messages' `output_text` parts, reasoning items left out) beside the dataset row's own fields,
  one rollout a request, answered with the request and its `reward` (`BaseVerifyResponse`). Its agents seed and
  close a session around each rollout (`/seed_session`, `/close_session`): the service keeps none and answers
  with the session id it was given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from rrc_jax.service.cohorts import Rollout


class BadRequest(ValueError):
    """A request the service refuses; `status` is its HTTP status (400: a field, 409: a cohort's refusal)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Protocol(NamedTuple):
    parse: Callable[[object, int], list[Rollout]]
    answer: Callable[[dict, Sequence[float]], object]  # (the request's body, its rollouts' rewards) -> JSON


def _texts(body: dict, name: str) -> list:
    value = body.get(name)
    if not isinstance(value, list):
        raise BadRequest(f"{name}: a list, not {type(value).__name__}")
    return value


def parse_openrlhf(body, group_size: int) -> list[Rollout]:
    if not isinstance(body, dict):
        raise BadRequest("the body is not a JSON object")
    queries, prompts = _texts(body, "query"), _texts(body, "prompts")
    if len(queries) != len(prompts):
        raise BadRequest(f"query and prompts: {len(queries)} and {len(prompts)} items, not one prompt a query")
    out = []
    for i, (query, prompt) in enumerate(zip(queries, prompts)):
        if not (isinstance(query, str) and isinstance(prompt, str)):
            raise BadRequest(f"query[{i}] and prompts[{i}]: texts")
        if not query.startswith(prompt):
            raise BadRequest(f"query[{i}]: does not start with prompts[{i}] (the query is the prompt and its response)")
        out.append(Rollout(prompt=prompt, completion=query[len(prompt):], group_size=group_size))
    return out


def _chat_text(prompt, field: str) -> str:
    """A prompt given as a text, or as chat messages (`{"role", "content"}`, a content a text or a list of
    `{"type", "text"}` parts): their `role: content` lines."""
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        def content(c):
            return "".join(part.get("text", "") for part in c if isinstance(part, dict)) if isinstance(c, list) else c
        prompt = "\n".join(f"{m.get('role', '')}: {content(m.get('content', ''))}" for m in prompt)
    if not isinstance(prompt, str):
        raise BadRequest(f"{field}: a text or a list of messages, not {type(prompt).__name__}")
    return prompt


def parse_slime(body, group_size: int) -> list[Rollout]:
    if not isinstance(body, dict):
        raise BadRequest("the body is not a JSON object")
    prompt, response = _chat_text(body.get("prompt"), "prompt"), body.get("response")
    if not isinstance(response, str):
        raise BadRequest(f"response: a text, not {type(response).__name__}")
    return [Rollout(prompt=prompt, completion=response, group_size=group_size)]


def parse_nemo_gym(body, group_size: int) -> list[Rollout]:
    if not isinstance(body, dict):
        raise BadRequest("the body is not a JSON object")
    params, response = body.get("responses_create_params"), body.get("response")
    if not isinstance(params, dict) or "input" not in params:
        raise BadRequest("responses_create_params: an object with the Responses API's input")
    prompt = _chat_text(params["input"], "responses_create_params.input")
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        raise BadRequest("response: a Responses API response with its output items")
    texts = [part.get("text", "") for item in response["output"]
             if isinstance(item, dict) and item.get("type") == "message" and isinstance(item.get("content"), list)
             for part in item["content"] if isinstance(part, dict) and part.get("type") == "output_text"]
    if not texts:
        raise BadRequest("response.output: no message with output_text: nothing to judge")
    return [Rollout(prompt=prompt, completion="".join(texts), group_size=group_size)]


PROTOCOLS = {
    "openrlhf": Protocol(parse_openrlhf, lambda body, r: {"rewards": list(r), "scores": list(r), "extra_logs": {}}),
    "slime": Protocol(parse_slime, lambda body, r: r[0]),
    "nemo_gym": Protocol(parse_nemo_gym, lambda body, r: {**body, "reward": r[0]}),
}
# the path each protocol's trainer posts to (NeMo Gym's is fixed: a resources server's root)
PATHS = {"openrlhf": "/openrlhf", "slime": "/slime", "nemo_gym": "/verify"}
