"""A judge pool: several OpenAI-compatible endpoints serving one model, asked as one (`OpenAISampler`, and so
the trainer's `inference.engine=openai` and the reward service's judge).

* **Spread by load.** Each attempt goes to the endpoint with the fewest requests in flight (then the fewest sent,
  then the first listed), so a slow or busy server gets less.
* **Retried elsewhere.** A request's next attempt goes to an endpoint it has not failed on, when one is not
  benched; only a request with nowhere else to go waits (the engine's backoff) before asking the same again.
* **Benched, probed again.** An endpoint whose `bench_after` attempts in a row failed is benched for `bench_s`
  seconds: no attempt goes there while another endpoint is in play. Then it is back, and its next attempt is the
  probe: a success clears it, a failure benches it again. Only an attempt started after the endpoint's last failure
  clears it (an answer to a request sent before it died says nothing of it now). When every endpoint is benched, the
  one whose bench ends first among those the request has not failed on is asked (a request is never refused by the
  pool itself), and a benched endpoint that fails again is benched anew from then: so a pool whose servers were all
  down finds the first that answers again, not the one benched first.
* **Counted.** Each endpoint's attempts, failures and benchings since the start (`health()`); the engine logs a
  step's per endpoint (`judge/endpoint<i>_attempts`, `_failed`, `_benched`).

Thread-safe (the engine's request threads share it); the clock is injectable for tests.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple


@dataclasses.dataclass
class Endpoint:
    """One server of the pool: its base URL, requests in flight, attempts failed in a row, the clock time of its last
    failure and the one its bench ends (0: never benched), and its totals since the start."""

    url: str
    index: int
    in_flight: int = 0
    failed_in_a_row: int = 0
    last_failure: float = float("-inf")
    benched_until: float = 0.0
    attempts: int = 0
    failures: int = 0
    benchings: int = 0


class Attempt(NamedTuple):
    """An attempt on `endpoint`, started at the pool's clock time `started`."""

    endpoint: Endpoint
    started: float

    @property
    def url(self) -> str:
        return self.endpoint.url

    @property
    def index(self) -> int:
        return self.endpoint.index


class EndpointPool:
    """The endpoints at `urls` (the module docstring)."""

    def __init__(self, urls: Sequence[str], *, bench_after: int = 3, bench_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        if not urls:
            raise ValueError("EndpointPool: no endpoint given")
        if len(set(urls)) != len(urls):
            raise ValueError(f"EndpointPool: an endpoint is listed twice: {', '.join(urls)}")
        if bench_after < 1 or not bench_s >= 0:
            raise ValueError(f"EndpointPool: need bench_after >= 1 and bench_s >= 0; got {bench_after}, {bench_s}")
        self.endpoints = [Endpoint(url, i) for i, url in enumerate(urls)]
        self.bench_after, self.bench_s, self.clock = bench_after, bench_s, clock
        self._lock = threading.Lock()

    def benched(self, e: Endpoint) -> bool:
        return e.benched_until > self.clock()

    def acquire(self, avoid: Collection[str] = ()) -> Attempt:
        """The endpoint for an attempt (counted in flight until `release`): the least loaded of those not benched
        and not in `avoid` (URLs the request failed on), else of those not benched, else the one whose bench ends
        first (of those not in `avoid`, when there are)."""
        with self._lock:
            now = self.clock()
            playing = [e for e in self.endpoints if e.benched_until <= now]
            fresh = [e for e in playing if e.url not in avoid]
            if fresh or playing:
                e = min(fresh or playing, key=lambda e: (e.in_flight, e.attempts, e.index))
            else:
                untried = [e for e in self.endpoints if e.url not in avoid]
                e = min(untried or self.endpoints, key=lambda e: (e.benched_until, e.index))
            e.in_flight += 1
            e.attempts += 1
            return Attempt(e, now)

    def release(self, attempt: Attempt, ok: bool) -> bool:
        """`attempt` ended, answered (`ok`) or failed; returns whether it benched its endpoint."""
        with self._lock:
            e = attempt.endpoint
            e.in_flight -= 1
            if ok:
                if attempt.started >= e.last_failure:
                    e.failed_in_a_row, e.benched_until = 0, 0.0
                return False
            now = self.clock()
            e.failures += 1
            e.failed_in_a_row += 1
            e.last_failure = now
            if e.failed_in_a_row < self.bench_after:
                return False
            newly = e.benched_until <= now
            e.benched_until = now + self.bench_s  # (benched again from now: a dead server goes to the back)
            e.benchings += newly
            return newly

    def health(self) -> list[dict]:
        """Each endpoint's state and totals, in the order given."""
        with self._lock:
            return [{"url": e.url, "in_flight": e.in_flight, "benched": self.benched(e), "attempts": e.attempts,
                     "failures": e.failures, "benchings": e.benchings} for e in self.endpoints]
