"""The reward service's HTTP endpoint: `POST /v1/rewards` (Starlette, run by uvicorn), rewards relative to a group
for rollouts that arrive one at a time or in any batches, from any trainer.

The request: `{"rollouts": [{"prompt", "completion", "group_size", "group", "request_id", "anchors", "seed"},
...]}` (1 to `max_rollouts` of them; `group` defaults to the prompt, `request_id` to none, `anchors`, AGR's for the
prompt, to the service's table, `seed` to the service's own stream). Each rollout joins its group's cohort
(`rrc_jax.service.cohorts`); the request is answered once every one of its rollouts' cohorts has been judged:
`{"rewards": [...], "cohorts": [...], "judge": {...}}` in the request's order (the cohort each rollout was counted
in; the judge's counters of the calls that judged them), and `"errors"` beside them (null where rewarded) when a
cohort failed. A field missing, of the wrong type or unknown, a body that is not JSON, nested too deeply or holding
a lone surrogate, or a group over `max_group_size` is a 400 naming it (`rollouts[3].group_size`), a rollout its
cohort refuses a 409, one that would open a cohort beyond `max_open_cohorts` a 429, and nothing of such a request is
counted. With an API key a request without its bearer token is a 401; a body too large a 413 (read no further);
a client with too many requests in flight a 429 (`make_app`).

Judging: `reward_cohorts(cohorts)` (blocking: a judge model) runs on one worker thread; the cohorts completed while
it runs are handed to its next call together, in turns among the clients (`turns`), so that concurrent cohorts
share the judge's calls and none holds them. When a call raises, each of its cohorts is judged again alone: a
cohort's failure stays its own, its cause named. With `per_rollout` (a construction whose reward of a rollout does
not depend on its group: AGR, PRC) a rollout does not wait for its group: it is a cohort of one, judged in the next
call with every rollout that arrived meanwhile. With `early` (a greedy round robin behind a judge that remembers
its judgments: `rrc_jax.service.rewards.Remembered`) the judge, when idle, asks the unfinished cohorts' questions
so far (the pairs of the rollouts in), whose answers the whole cohort's call then reads back; those calls' rewards
are dropped (`ServiceStats.early_calls`). A cohort open `timeout_s` after its first rollout is judged as it is when
it holds two rollouts or more, else each of its rollouts is answered with an error naming the group
(`CohortStats.expired`; `ServiceStats.failed`). A retried request (the same `request_id`s) waits for, or gets, the
first one's rewards: no cohort counts a rollout twice; a failure is never kept, so the retry of a failed rollout is
judged again.

`GET /health` returns the counts (`ServiceStats`, `CohortStats`) and the cohorts open and being judged;
`GET /v1/recipe` what the rewards are (a trainer checks it is its own). Both need the API key when there is one.

Shapes: R rollouts a request, G a group's size.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import hmac
import json
import math
from collections.abc import Callable, Sequence

from rrc_jax.rl.dynamic_sampling import merge_metrics
from rrc_jax.service.cohorts import COHORT_TIMEOUT_S, Answer, Cohort, CohortError, Cohorts, Rollout
from rrc_jax.service.protocols import PATHS, PROTOCOLS, BadRequest

try:
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
except ImportError as e:  # pragma: no cover - the optional extra
    raise ImportError("the reward service needs the serve extra: pip install -e '.[serve]'") from e

# cohorts -> one list of answers per cohort, one answer per rollout in order
RewardCohorts = Callable[[list[Cohort]], Sequence[Sequence[Answer]]]

FIELDS = {"prompt": str, "completion": str, "group_size": int, "group": str, "request_id": str, "anchors": list,
          "seed": int}
REQUIRED = ("prompt", "completion", "group_size")
UNAUTHORIZED = "Authorization: a bearer token is required (the service's --api_key)"


def find_surrogate(body, where: str = "body") -> str | None:
    """Where in a parsed JSON `body` a text (a value or a key) holds a lone surrogate (`"\ud800"`, which no
    encoding can write: not text a judge can read), e.g. `rollouts[3].completion`; None when nowhere."""
    stack = [(body, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    return at
        elif isinstance(value, dict):
            for key, item in value.items():
                name = key.encode("utf-8", "backslashreplace").decode()
                if name != key:
                    return f"{at} (a key)"
                stack.append((item, f"{at}.{key}"))
        elif isinstance(value, list):
            stack.extend((item, f"{at}[{i}]") for i, item in enumerate(value))
    return None


def parse_json(body: bytes):
    """A request's JSON body, or `BadRequest` naming what is wrong with it (not JSON, nested too deeply, a text
    holding a lone surrogate)."""
    try:
        parsed = json.loads(body)
    except RecursionError:
        raise BadRequest("the body's JSON is nested too deeply") from None
    except ValueError:
        raise BadRequest("the body is not JSON") from None
    bad = find_surrogate(parsed, "the body")
    if bad is not None:
        raise BadRequest(f"{bad}: a text holding a lone surrogate (not valid Unicode); send UTF-8 text")
    return parsed


def parse_rollouts(body, max_rollouts: int, max_group_size: int = 1 << 30) -> list[Rollout]:
    """The rollouts of a request's JSON `body`, checked field by field (`BadRequest` naming the first bad one)."""
    if not isinstance(body, dict):
        raise BadRequest("the body is not a JSON object")
    unknown = sorted(set(body) - {"rollouts"})
    if unknown:
        raise BadRequest(f"{', '.join(unknown)}: not fields of a rewards request (it has: rollouts)")
    items = body.get("rollouts")
    if not isinstance(items, list) or not 1 <= len(items) <= max_rollouts:
        raise BadRequest(f"rollouts: a list of 1 to {max_rollouts} rollouts")
    out = []
    for i, item in enumerate(items):
        where = f"rollouts[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where}: an object with {', '.join(FIELDS)}")
        unknown = sorted(set(item) - set(FIELDS))
        if unknown:
            raise BadRequest(f"{where}.{unknown[0][:80]}: not a field of a rollout (it has: {', '.join(FIELDS)})")
        for name in REQUIRED:
            if name not in item:
                raise BadRequest(f"{where}.{name}: missing")
        for name, kind in FIELDS.items():
            value = item.get(name, kind())
            if name == "seed" and value is None:
                continue
            if not isinstance(value, kind) or isinstance(value, bool):
                raise BadRequest(f"{where}.{name}: {type(value).__name__}, not {kind.__name__}")
        if item["group_size"] < 2:
            raise BadRequest(f"{where}.group_size: {item['group_size']}, a group has at least 2 rollouts")
        if item["group_size"] > max_group_size:
            raise BadRequest(f"{where}.group_size: {item['group_size']}, more than the service's largest group "
                             f"(--max_group_size={max_group_size})")
        if not 0 <= (item.get("seed") or 0) < 1 << 32:
            raise BadRequest(f"{where}.seed: {item['seed']}, a seed is an integer in [0, 2^32)")
        anchors = item.get("anchors", [])
        if not all(isinstance(a, str) for a in anchors):
            raise BadRequest(f"{where}.anchors: a list of texts")
        out.append(Rollout(**{**item, "anchors": tuple(anchors)}))
    return out


@dataclasses.dataclass
class ServiceStats:
    """Counts since the start: requests answered, requests refused (4xx), judge calls (and those that asked
    unfinished cohorts' questions early), cohorts judged (whole or expired with two rollouts or more), rollouts
    failed (expired alone, or the judge's error) and, of those, the cohorts failed by the judge (its error, or its
    servers' failed requests beyond `max_failed_fraction`: `rrc_jax.service.rewards`)."""

    requests: int = 0
    bad_requests: int = 0
    judge_calls: int = 0
    early_calls: int = 0
    judged: int = 0
    failed: int = 0
    judge_failures: int = 0


def turns(ready: Sequence[Cohort], max_rollouts: int) -> tuple[list[Cohort], list[Cohort]]:
    """The cohorts of `ready` (in the order they became ready) for the next judge call, and those left for later.

    A unit is what one construction call judges together: the ready cohorts of one `seed` (a request's groups,
    judged as the requester's in-process call would), or an unseeded cohort alone. The call takes units in turns
    among the clients that sent them (each client's oldest first, one a client a round) until it holds
    `max_rollouts` rollouts; a unit is never split and the first is always taken. So one client's many or large
    cohorts share the judge with the others' instead of holding it."""
    units: dict[tuple, list[Cohort]] = {}
    for c in ready:
        units.setdefault(("seed", c.seed) if c.seed is not None else ("cohort", c.serial), []).append(c)
    by_client: dict[str, list[list[Cohort]]] = {}
    for unit in units.values():
        by_client.setdefault(unit[0].client, []).append(unit)
    queues = list(by_client.values())
    taken, size = [], 0
    while any(queues) and (not taken or size < max_rollouts):
        for queue in queues:
            if queue and (not taken or size < max_rollouts):
                unit = queue.pop(0)
                taken += unit
                size += sum(len(c.rollouts) for c in unit)
    chosen = {c.serial for c in taken}
    return taken, [c for c in ready if c.serial not in chosen]


class RewardService:
    """`Cohorts` and the worker that judges them (the module docstring). Create and use it on one event loop."""

    def __init__(self, reward_cohorts: RewardCohorts, *, timeout_s: float = COHORT_TIMEOUT_S, poll_s: float = 0.5,
                 remember: int = 100_000, per_rollout: bool = False, early: bool = False,
                 max_open_cohorts: int = 1 << 30, max_call_rollouts: int = 1024):
        self.reward_cohorts, self.poll_s, self.per_rollout, self.early = reward_cohorts, poll_s, per_rollout, early
        self.max_call_rollouts = max_call_rollouts
        self._asked: dict[int, int] = {}  # cohort serial -> its rollouts whose questions were asked early
        self.cohorts = Cohorts(timeout_s=timeout_s, remember=remember, max_open=max_open_cohorts)
        self.stats = ServiceStats()
        self._futures: dict[int, asyncio.Future] = {}  # cohort serial -> its answers
        self._ready: list[Cohort] = []
        self._judging = 0
        self.draining = False
        self._wake: asyncio.Event | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="judge")

    def _future(self, serial: int) -> asyncio.Future:
        if serial not in self._futures:
            self._futures[serial] = asyncio.get_running_loop().create_future()
        return self._futures[serial]

    def _start(self) -> None:
        if self._task is None:
            self._wake, self._event_loop = asyncio.Event(), asyncio.get_running_loop()
            self._task = self._event_loop.create_task(self._loop())

    def drain(self) -> None:
        """Stop taking rollouts (a request is then a 503) and close every open cohort now: judged as it is from two
        rollouts, else failed; so every request taken is answered. Safe from any thread (a signal handler)."""
        self.draining = True
        if self._task is not None:
            self._event_loop.call_soon_threadsafe(self._wake.set)

    async def reward(self, rollouts: Sequence[Rollout], client: str = "") -> tuple[list[Answer], list[int]]:
        """Count `rollouts` (sent by `client`) and wait for their answers; returns them and each one's cohort
        serial. A `CohortError` when the cohorts refuse one (nothing of the request counted)."""
        self._start()
        if self.draining:
            raise BadRequest("the service is stopping: send the rollouts to another", 503)
        if self.per_rollout:  # each its own cohort of one, whole at once (a retry repeats it: the same rollout)
            rollouts = [dataclasses.replace(r, group=f"{r.key}\x1f{r.request_id}", group_size=1) for r in rollouts]
        for k, r in enumerate(rollouts):  # refuse before counting anything
            self.cohorts.check(r, rollouts[:k])
        places = []
        for r in rollouts:
            place, whole = self.cohorts.add(r, client)
            places.append(place)
            if whole is not None:
                self._ready.append(whole)
                self._wake.set()
        # each rollout's answer, or its cohort's future, taken before the first wait (a cohort settled meanwhile
        # drops its future)
        waits = [(self.cohorts.answer(r.request_id) if r.request_id else None) or self._future(place.cohort)
                 for r, place in zip(rollouts, places)]
        answers = [w if isinstance(w, Answer) else (await asyncio.shield(w))[place.index]
                   for w, place in zip(waits, places)]
        return answers, [p.cohort for p in places]

    async def _loop(self) -> None:
        """Expire late cohorts, and judge the ready ones in turns (`turns`), until cancelled."""
        while True:
            if not self._ready:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
                self._wake.clear()
            for late in self.cohorts.expire(every=self.draining):
                if len(late.rollouts) >= 2:
                    self._ready.append(late)
                else:
                    why = "the service stopped" if self.draining else f"{self.cohorts.timeout_s:g} s passed"
                    error = (f"group {late.key[:80]!a}: {len(late.rollouts)} of its {late.size} rollouts had arrived "
                             f"when {why}; a group needs at least 2 to be judged")
                    self._settle(late, [Answer(error=error)] * len(late.rollouts))
                    self.stats.failed += len(late.rollouts)
            if not self._ready:
                await self._ask_early()
                continue
            batch, self._ready = turns(self._ready, self.max_call_rollouts)
            self._judging = len(batch)
            try:
                answers = await self._judge(batch)
            finally:
                self._judging = 0
            self.stats.judge_calls += 1
            for cohort, answer in zip(batch, answers):
                failed = sum(bool(a.error) for a in answer)
                self.stats.failed += failed
                self.stats.judge_failures += bool(failed)
                self.stats.judged += not failed
                self._settle(cohort, list(answer))

    async def _judge(self, batch: list[Cohort]) -> list[list[Answer]]:
        """`reward_cohorts(batch)` on the judge's thread, checked; when it raises, each cohort again alone, so that
        a cohort's failure (its error named) stays its own."""
        def call(cohorts: list[Cohort]) -> list[list[Answer]]:
            answers = self.reward_cohorts(cohorts)
            if len(answers) != len(cohorts) or any(len(a) != len(c.rollouts) for a, c in zip(answers, cohorts)):
                raise RuntimeError(f"reward_cohorts answered {[len(a) for a in answers]} rollouts for cohorts of "
                                   f"{[len(c.rollouts) for c in cohorts]}")
            return [list(a) for a in answers]

        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, call, batch)
        except Exception as e:  # noqa: BLE001 - the judge's failure is reported to the rollouts it concerns
            if len(batch) == 1:
                return [[Answer(error=f"{type(e).__name__}: {e}")] * len(batch[0].rollouts)]
        return [answer for c in batch for answer in await self._judge([c])]

    async def _ask_early(self) -> None:
        """With `early`: the questions of the unfinished cohorts of two rollouts or more that grew since theirs were
        last asked, in one call whose rewards are dropped (its judgments are remembered)."""
        if not self.early or self.draining:
            return
        grown = [c for c in self.cohorts.unfinished() if len(c.rollouts) >= 2 and
                 self._asked.get(c.serial, 0) < len(c.rollouts)]
        if not grown:
            return
        self._asked.update((c.serial, len(c.rollouts)) for c in grown)
        with contextlib.suppress(Exception):  # (a failure here is the whole cohort's call's to report)
            await asyncio.get_running_loop().run_in_executor(self._pool, self.reward_cohorts, grown)
        self.stats.early_calls += 1

    def _settle(self, cohort: Cohort, answers: list[Answer]) -> None:
        self._asked.pop(cohort.serial, None)
        self.cohorts.settle(cohort, answers)
        self._future(cohort.serial).set_result(answers)
        del self._futures[cohort.serial]  # its waiters hold it; a later retry reads `Cohorts.answer`

    def health(self) -> dict:
        return {"status": "ok", **dataclasses.asdict(self.stats), **dataclasses.asdict(self.cohorts.stats),
                "open": self.cohorts.open, "judging": self._judging, "ready": len(self._ready)}

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pool.shutdown(wait=True)


def _error(message: str, status: int) -> JSONResponse:
    message = message.encode("utf-8", "backslashreplace").decode()  # (a client's text may hold a lone surrogate)
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status)


def _same_token(given: str, expected: str) -> bool:
    """`given == expected` in constant time, whatever characters `given` holds."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def judge_metrics(answers: Sequence[Answer]) -> dict[str, float | None]:
    """The judge's counters behind `answers` (`Answer.metrics`, one dict a construction call, each counted once),
    merged as a step's draws are (`rrc_jax.rl.dynamic_sampling.merge_metrics`: totals summed, the rest averaged);
    None where undefined (JSON has no NaN)."""
    calls = list({id(a.metrics): a.metrics for a in answers if a.metrics}.values())
    if not calls:
        return {}
    keys = dict.fromkeys(k for m in calls for k in m)
    merged = merge_metrics([{k: m.get(k, math.nan) for k in keys} for m in calls])
    return {k: v if math.isfinite(v) else None for k, v in merged.items()}


def make_app(reward_cohorts: RewardCohorts, *, timeout_s: float = COHORT_TIMEOUT_S, max_rollouts: int = 4096,
             poll_s: float = 0.5, api_key: str = "", max_body_bytes: int = 64 << 20,
             max_client_requests: int = 8192, group_size: int = 0,
             judge_health: Callable[[], dict] | None = None, per_rollout: bool = False,
             early: bool = False, max_group_size: int = 64, max_open_cohorts: int = 1024,
             max_call_rollouts: int = 1024, recipe: dict | None = None) -> Starlette:
    """The ASGI app of a `RewardService` over `reward_cohorts`: `POST /v1/rewards`, the peers' endpoints
    (`POST /openrlhf`, `/slime`, NeMo Gym's `/verify` with its `/seed_session` and `/close_session`:
    `rrc_jax.service.protocols`, their groups of `group_size`), `GET /health` and `GET /v1/recipe` (`recipe`: what
    the rewards are, for a trainer to check against its own). `app.state.service` is the service.

    With `api_key`, every request carries `Authorization: Bearer <api_key>` (else 401; the peers' endpoints take
    it as the URL's `key` parameter too), `/health` and `/v1/recipe` included. A body over `max_body_bytes` is a
    413 (reading stops there); a client (by address) with `max_client_requests` requests in flight gets a 429 for
    the next (a trainer sends each rollout of a step at once: the limit bounds one client's share, not a step); a
    group over `max_group_size` rollouts a 400; a rollout that would open a cohort beyond `max_open_cohorts` a
    429. A judge call holds up to `max_call_rollouts` rollouts, taken in turns among clients (`turns`).
    `judge_health()`, when given, is the judge's state in `GET /health` (`judge`); `per_rollout`: each rollout
    judged as it arrives; `early`: unfinished cohorts' questions asked while the judge is idle (`RewardService`)."""
    from rrc_jax.inference.server import BodyTooLarge, read_body  # (the same limit as the judge server's)

    service = RewardService(reward_cohorts, timeout_s=timeout_s, poll_s=poll_s, per_rollout=per_rollout, early=early,
                            max_open_cohorts=max_open_cohorts, max_call_rollouts=max_call_rollouts)
    in_flight: collections.Counter[str] = collections.Counter()

    def authorized(request: Request) -> bool:
        """The bearer token, or on the peers' endpoints (whose trainers send no header of their own) the URL's
        `key` parameter (`http://host:8100/openrlhf?key=TOKEN`)."""
        if not api_key:
            return True
        if request.url.path not in ("/v1/rewards", "/health", "/v1/recipe") and "key" in request.query_params:
            return _same_token(request.query_params["key"], api_key)
        return _same_token(request.headers.get("authorization", ""), f"Bearer {api_key}")

    def refusal(request: Request, client: str) -> BadRequest | None:
        """The 4xx a request from `client` gets before its body is read, or None."""
        if not authorized(request):
            return BadRequest(UNAUTHORIZED, 401)
        if in_flight[client] >= max_client_requests:
            return BadRequest(f"{in_flight[client]} requests of this client are in flight, the service's most "
                              f"(--max_client_requests={max_client_requests}); wait for their answers", 429)
        return None

    async def judged(request: Request, parse) -> tuple[object, list[Answer], list[int]] | JSONResponse:
        """A request's JSON body, the answers of its rollouts (`parse(body)`) and their cohorts, or the refusal's
        response."""
        client = request.client.host if request.client else ""
        try:
            refused = refusal(request, client)
            if refused is not None:
                raise refused
            in_flight[client] += 1
            try:
                try:
                    body = await read_body(request, max_bytes=max_body_bytes)
                except BodyTooLarge as e:
                    raise BadRequest(f"the body's {e.size} bytes or more exceed the service's {max_body_bytes} "
                                     "(--max_body_mb): send fewer rollouts a request", 413) from None
                parsed = parse_json(body)
                return (parsed, *await service.reward(parse(parsed), client))
            finally:
                in_flight[client] -= 1
        except (BadRequest, CohortError) as e:
            service.stats.bad_requests += 1
            return _error(str(e), getattr(e, "status", 409))
        except ClientDisconnect:
            return Response(status_code=400)

    async def rewards(request: Request) -> Response:
        out = await judged(request, lambda body: parse_rollouts(body, max_rollouts, max_group_size))
        if isinstance(out, Response):
            return out
        _, answers, cohorts = out
        service.stats.requests += 1
        body = {"rewards": [a.reward for a in answers], "cohorts": cohorts}
        judge = judge_metrics(answers)
        if judge:
            body["judge"] = judge
        if any(a.error for a in answers):
            body["errors"] = [a.error or None for a in answers]
        return JSONResponse(body)

    def peer(name, protocol):
        async def endpoint(request: Request) -> Response:
            if group_size < 2:
                service.stats.bad_requests += 1
                return _error(f"this service has no group size for {name}'s rollouts (they carry none): start it "
                              "with the trainer's samples per prompt, --config.rl.group_size", 400)
            out = await judged(request, lambda body: protocol.parse(body, group_size))
            if isinstance(out, Response):
                return out
            body, answers, _ = out
            errors = [a.error for a in answers if a.error]
            if errors:  # the peers read numbers only
                return JSONResponse({"error": {"message": errors[0], "type": "server_error"}}, 500)
            service.stats.requests += 1
            return JSONResponse(protocol.answer(body, [a.reward for a in answers]))
        return endpoint

    async def session(request: Request) -> JSONResponse:
        """NeMo Gym's `/seed_session` and `/close_session`: no state; the session id given is the answer."""
        if not authorized(request):
            return _error(UNAUTHORIZED, 401)
        with contextlib.suppress(ValueError, BadRequest, ClientDisconnect):
            body = parse_json(await read_body(request, max_bytes=1 << 16) or b"{}")
            if isinstance(body, dict) and "resources_session_id" in body:
                return JSONResponse({"resources_session_id": body["resources_session_id"]})
        return JSONResponse({})

    async def health(request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(UNAUTHORIZED, 401)
        extra = {"judge": judge_health()} if judge_health is not None else {}
        return JSONResponse({**service.health(), **extra})

    async def recipe_endpoint(request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(UNAUTHORIZED, 401)
        return JSONResponse(recipe or {})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await service.close()

    peers = [Route(PATHS[name], peer(name, protocol), methods=["POST"]) for name, protocol in PROTOCOLS.items()]
    sessions = [Route(path, session, methods=["POST"]) for path in ("/seed_session", "/close_session")]
    app = Starlette(routes=[Route("/v1/rewards", rewards, methods=["POST"]), *peers, *sessions,
                            Route("/health", health), Route("/v1/recipe", recipe_endpoint)], lifespan=lifespan)
    app.state.service = service
    return app


def service_server(app: Starlette):
    """The uvicorn server of a reward service's `app` that drains it on SIGTERM or Ctrl-C (`RewardService.drain`)
    and then waits for every request taken to be answered before it stops."""
    import uvicorn  # the serve extra

    class Draining(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            app.state.service.drain()
            super().handle_exit(sig, frame)

    return Draining(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=None))
