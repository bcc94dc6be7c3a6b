"""Cohorts: the rollouts of one GRPO group, gathered from requests that arrive one at a time or in any batches until
the group is whole, so that a reward relative to the group (SCR's win counts, AGR's anchors beaten, a tournament's
standing) can be computed by a service that sees rollouts as a trainer sends them (`rrc_jax.service`).

A rollout names its group by `group` (the caller's group id; by default its prompt) and its size G (`group_size`).
The rollouts of a group fill its open cohort in arrival order; the G-th completes it, and the group's next rollout
opens a new cohort (a prompt drawn twice in one batch is two cohorts, filled in turn). Every rollout of a cohort
carries its prompt, G, anchors and `seed` (what seeds its judgments), or is refused (`CohortError`, naming the
field). At most `max_open` cohorts fill at once: a rollout that would open another is refused (`CohortError` with
`status` 429).

A rollout with a `request_id` is counted once: the same id again (a client's retry) gets the first one's place,
whether its cohort is open, being judged or rewarded (a reward is kept for the last `remember` rewarded ids); the
same id with another rollout is refused. A failure is never kept: once a rollout's cohort failed, its id is free,
and a retry is a new rollout (judged again). A rollout without an id is a new rollout every time.

A cohort still open `timeout_s` after its first rollout expires (`expire`): the caller applies its rule (the
service judges what arrived when it is at least two rollouts, else answers with an error naming the group) and
settles it like a whole one.

Pure bookkeeping: no clock but the one given, no threads (the service calls it from its event loop), no judge.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence


COHORT_TIMEOUT_S = 100.0  # a service's default: below its clients' own timeouts (OpenRLHF's 180 s, slime's 120 s)


class CohortError(ValueError):
    """A rollout the cohorts refuse; the message names the field and the group. `status`: the HTTP status a service
    answers with (409: it contradicts its cohort; 429: too many cohorts open)."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One completion to reward: its prompt and text, its group (`group`, default the prompt) of `group_size`
    rollouts, the caller's `request_id` (a retry repeats it), the prompt's AGR `anchors` when the caller holds
    them (a trainer's own reference samples; else the service's table) and the `seed` of its judgments (None: the
    service's own stream)."""

    prompt: str
    completion: str
    group_size: int
    group: str = ""
    request_id: str = ""
    anchors: tuple[str, ...] = ()
    seed: int | None = None

    @property
    def key(self) -> str:
        return self.group or self.prompt


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a rollout is counted: cohort `cohort` (a serial number, in the order cohorts opened), position
    `index` in it (arrival order)."""

    cohort: int
    index: int


@dataclasses.dataclass
class Cohort:
    """The rollouts of one group, `size` of them once whole; `opened` is the clock's time of the first, `client`
    the caller that opened it (the service's turns)."""

    serial: int
    key: str
    prompt: str
    size: int
    opened: float
    anchors: tuple[str, ...] = ()
    seed: int | None = None
    client: str = ""
    rollouts: list[Rollout] = dataclasses.field(default_factory=list)

    @property
    def whole(self) -> bool:
        return len(self.rollouts) == self.size


@dataclasses.dataclass(frozen=True)
class Answer:
    """A rollout's answer: its `reward`, or the `error` that replaced it (an expired cohort of one rollout, the
    judge's failure); `metrics`: the judge's counters of the call that judged it (shared by its cohorts)."""

    reward: float | None = None
    error: str = ""
    metrics: dict | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass
class CohortStats:
    """Counts since the start: rollouts counted, retries answered from their first place, cohorts completed whole,
    cohorts expired (judged partial or failed), rollouts refused."""

    rollouts: int = 0
    retries: int = 0
    whole: int = 0
    expired: int = 0
    refused: int = 0


class Cohorts:
    """The open cohorts (one per group at most, `max_open` at most), the places of request ids whose cohorts are not
    settled, and the rewards of the last `remember` request ids. `clock` is seconds (monotonic)."""

    def __init__(self, *, timeout_s: float, remember: int = 100_000, max_open: int = 1 << 30,
                 clock: Callable[[], float] = time.monotonic):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0")
        self.timeout_s, self.remember, self.max_open, self.clock = timeout_s, remember, max_open, clock
        self.stats = CohortStats()
        self._open: dict[str, Cohort] = {}
        self._places: dict[str, tuple[Place, Rollout]] = {}  # request id -> its place, while its cohort is unsettled
        self._answers: collections.OrderedDict[str, tuple[Place, Rollout, Answer]] = collections.OrderedDict()
        self._serial = 0

    def check(self, rollout: Rollout, earlier: Sequence[Rollout] = ()) -> Place | None:
        """The `CohortError` `add` would raise for `rollout` after `earlier` (a request's rollouts before it, not
        yet added), counting nothing but the refusal: a service refuses a whole request before counting any of it.
        Returns the first place of a retried request id, else None."""
        def refuse(message: str) -> CohortError:
            self.stats.refused += 1
            return CohortError(message)

        if not isinstance(rollout.group_size, int) or rollout.group_size < 1:
            raise refuse(f"group_size={rollout.group_size!r} of group {rollout.key!r} must be an integer >= 1")
        first = self._first(rollout)
        if first is not None:
            return first
        if any(e.request_id == rollout.request_id and e != rollout for e in earlier if rollout.request_id):
            raise refuse(f"request_id {rollout.request_id!r} is given twice in one request with different rollouts")
        ref = next(((e.prompt, e.group_size, e.anchors, e.seed) for e in earlier if e.key == rollout.key), None)
        cohort = self._open.get(rollout.key)
        ref = ref or (cohort and (cohort.prompt, cohort.size, cohort.anchors, cohort.seed))
        if ref and ref != (rollout.prompt, rollout.group_size, rollout.anchors, rollout.seed):
            field = next(f for f, a, b in zip(("prompt", "group_size", "anchors", "seed"), ref,
                                              (rollout.prompt, rollout.group_size, rollout.anchors, rollout.seed))
                         if a != b)
            raise refuse(f"{field} of a rollout of group {rollout.key[:80]!a} differs from its cohort's (group_size "
                         f"{ref[1]}): every rollout of a group carries the same prompt, group_size, anchors and seed")
        if self._open_after((*earlier, rollout)) > max(self.max_open, len(self._open)):
            self.stats.refused += 1
            raise CohortError(f"{len(self._open)} cohorts are open, the service's most (--max_open_cohorts="
                              f"{self.max_open}): wait for their answers, or send whole groups", 429)
        return None

    def _open_after(self, rollouts: Sequence[Rollout]) -> int:
        """The cohorts open once `rollouts` (new ones, checked) are added."""
        sizes = {r.key: r.group_size for r in rollouts}
        after = len(self._open)
        for key, n in collections.Counter(r.key for r in rollouts).items():
            have = len(self._open[key].rollouts) if key in self._open else 0
            after += ((have + n) % sizes[key] != 0) - (key in self._open)
        return after

    def add(self, rollout: Rollout, client: str = "") -> tuple[Place, Cohort | None]:
        """Count `rollout` (sent by `client`): its place, and the cohort it completed (now unsettled: the caller
        judges it) or None. A retried request id returns its first place (and None); `answer` then has its reward
        once settled."""
        first = self.check(rollout)
        if first is not None:
            self.stats.retries += 1
            return first, None
        cohort = self._open.get(rollout.key)
        if cohort is None:
            cohort = self._open[rollout.key] = Cohort(self._serial, rollout.key, rollout.prompt, rollout.group_size,
                                                      self.clock(), rollout.anchors, rollout.seed, client)
            self._serial += 1
        place = Place(cohort.serial, len(cohort.rollouts))
        cohort.rollouts.append(rollout)
        self.stats.rollouts += 1
        if rollout.request_id:
            self._places[rollout.request_id] = (place, rollout)
        if not cohort.whole:
            return place, None
        del self._open[cohort.key]
        self.stats.whole += 1
        return place, cohort

    def _first(self, rollout: Rollout) -> Place | None:
        """The place of `rollout`'s request id counted before, or None; a `CohortError` when the id came with
        another rollout."""
        if not rollout.request_id:
            return None
        seen = self._places.get(rollout.request_id) or self._answers.get(rollout.request_id)
        if seen is None:
            return None
        if seen[1] != rollout:
            self.stats.refused += 1
            raise CohortError(f"request_id {rollout.request_id[:80]!a} was given before with another rollout (group "
                              f"{seen[1].key[:80]!a}): a retry repeats its request unchanged")
        return seen[0]

    def expire(self, *, every: bool = False) -> list[Cohort]:
        """The open cohorts whose first rollout came `timeout_s` or more ago (with `every`, all of them: a service
        draining), closed (now unsettled: the caller judges or fails them)."""
        now = self.clock()
        late = [c for c in self._open.values() if every or now - c.opened >= self.timeout_s]
        for c in late:
            del self._open[c.key]
        self.stats.expired += len(late)
        return late

    def settle(self, cohort: Cohort, answers: Sequence[Answer]) -> None:
        """Record a handed-out cohort's answers, one per rollout in order: its request ids' rewards are kept (the
        last `remember`); a failed rollout's id is forgotten (a retry is judged again)."""
        if len(answers) != len(cohort.rollouts):
            raise ValueError(f"{len(answers)} answers for the {len(cohort.rollouts)} rollouts of cohort "
                             f"{cohort.serial} (group {cohort.key!r})")
        if self._open.get(cohort.key) is cohort:
            raise ValueError(f"cohort {cohort.serial} (group {cohort.key!r}) is still open: settle the cohorts "
                             "`add` completed or `expire` closed")
        for k, (rollout, answer) in enumerate(zip(cohort.rollouts, answers)):
            if rollout.request_id:
                self._places.pop(rollout.request_id, None)
                if answer.error:
                    continue
                self._answers[rollout.request_id] = (Place(cohort.serial, k), rollout, answer)
                self._answers.move_to_end(rollout.request_id)
        while len(self._answers) > self.remember:
            self._answers.popitem(last=False)

    def answer(self, request_id: str) -> Answer | None:
        """The reward of a settled rollout's request id (among the last `remember`), else None."""
        seen = self._answers.get(request_id)
        return seen[2] if seen else None

    def unfinished(self) -> list[Cohort]:
        """The cohorts still filling, as they are now (copies: the caller may read them anywhere)."""
        return [dataclasses.replace(c, rollouts=list(c.rollouts)) for c in self._open.values()]

    @property
    def open(self) -> int:
        """Cohorts still filling."""
        return len(self._open)
