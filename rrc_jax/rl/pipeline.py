"""The asynchronous step (`rl.max_staleness = k`): a step's rollouts are sampled up to k updates before the update
that learns from them, and judged meanwhile.

With k = 0 every step samples, waits for its rewards, then learns (the synchronous step). With k >= 1 the policy
samples batches 1..k before step 1, and step t

1. samples batch t + k with the weights of the updates so far (t - 1), records their log-probabilities (the behaviour
   policy, `Groups.with_behaviour`) and what the reward reads beside the responses (`Construction.prepare`: AGR's
   anchors, PRC's o_ref), and hands the batch to the judge;
2. waits for batch t's rewards (judged while step t - 1 learned and batch t + k was sampled);
3. learns from batch t, the GRPO ratio against the behaviour log-probs (every row's `old_logp`).

Batch s is sampled by weights of version max(0, s - k - 1) and learned from by version s - 1: its rows are at most k
updates stale (`staleness/mean`, `staleness/max`). Keys and prompts are those of k = 0 (batch s samples from step s's
key and is the pipeline's s-th batch of prompts); only the weights that sample it differ.

The judge is a worker thread that runs the reward construction's calls one at a time in the order they were handed
over, so while it judges, the trainer's thread samples and learns (the served judge, the reward service, or a judge
in this process whose programs may run beside the policy's: one device, one host). Where its calls cannot run beside
the trainer's (`overlap_refusal`: a judge sharing a multi-device mesh with the policy, whose programs two threads
would launch in different orders; host collectives on several hosts) they run on the trainer's thread, in the same
order: the same rewards and staleness, without the overlap.

In flight at a checkpoint (after step t): batches t + 1..t + k, sampled, with their behaviour log-probs, weight
versions and prepared reward inputs (`Pipeline.get_state`, in the checkpoint's data item with the prompt pipeline's
state, every host's rows). A resume hands them to the judge again: a reward is a function of the responses, the
prepared inputs and the step (its judge reseeded per step), so it is judged again to what it was.

k may change on resume (`resume.allow_changes`). The batches a checkpoint holds in flight are learned from at their
steps whatever the resumed k: a larger k samples the further ones, a smaller k samples no batch already in flight,
and k = 0 learns from them before its steps sample their own (`Backlog`). So no batch sampled is dropped, and the
prompt pipeline, which gave them already, is neither rewound nor skipped. A checkpoint of a synchronous run (its
data item the prompt pipeline's state alone) resumes at k >= 1 with nothing in flight: the first k batches are
sampled then, as a new run's are.

Dynamic sampling: the step's first batch is the pipelined one; the batches drawn to fill it are sampled when the step
waits for its rewards, with that moment's weights (staleness 0), and judged before the step learns. Evaluation waits
until the judge has nothing in flight (it asks the same judge), then runs on the trainer's thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable
from typing import ClassVar, Generic, TypeVar

import jax
import numpy as np

from rrc_jax import distributed, fault_points
from rrc_jax.rl.rollout import Groups
from rrc_jax.settings import at_least


Result = TypeVar("Result")  # what the reward gives a batch: the trainer's `rrc_jax.rl.dynamic_sampling.Draw`


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """How far the rollout runs ahead of the learner (`rl`)."""

    GROUP: ClassVar[str] = "rl"
    # k: a step learns from rollouts sampled at most k updates before (0: the synchronous step; module docstring)
    max_staleness: int = 0

    def __post_init__(self):
        at_least("rl", "max_staleness", self.max_staleness, 0)


@dataclasses.dataclass(frozen=True)
class Sampled:
    """One batch of this host's prompts and their sampled groups, not yet rewarded: `prompt_index [B]`, the prompts'
    texts, the `groups` (with their behaviour policy under k >= 1), the construction's prepared `inputs`
    (`Construction.prepare`), the seconds spent sampling and the tokens sampled."""

    prompt_index: np.ndarray
    prompts: list[str]
    groups: Groups
    inputs: dict | None
    rollout_seconds: float
    sampled_tokens: int

    def record(self) -> dict:
        """This batch as JSON values (float32 log-probs exactly: a float64 holds each)."""
        g = self.groups
        return {"prompt_index": [int(i) for i in self.prompt_index], "prompts": self.prompts, "inputs": self.inputs,
                "texts": g.texts, "prompt_ids": g.prompt_ids, "responses": [r.tolist() for r in g.responses],
                "truncated": g.truncated.tolist(), "logprobs": [lp.tolist() for lp in g.logprobs],
                "versions": g.versions.tolist(),
                "rollout_seconds": self.rollout_seconds, "sampled_tokens": self.sampled_tokens}

    @staticmethod
    def of_record(r: dict) -> Sampled:
        groups = Groups(r["texts"], r["prompt_ids"], [np.asarray(x, np.int32) for x in r["responses"]],
                        np.asarray(r["truncated"], bool), [np.asarray(x, np.float32) for x in r["logprobs"]],
                        np.asarray(r["versions"], np.int64))
        inputs = None if r["inputs"] is None else dict(r["inputs"])
        return Sampled(np.asarray(r["prompt_index"], np.int64), list(r["prompts"]), groups, inputs,
                       float(r["rollout_seconds"]), int(r["sampled_tokens"]))


def staleness_metrics(groups: Groups, step: int) -> dict[str, float]:
    """`staleness/mean`, `staleness/max`: the updates between the weights that sampled each row and those that learn
    from it at `step` (version `step - 1`)."""
    stale = (step - 1) - np.asarray(groups.versions)
    return {"staleness/mean": float(stale.mean()), "staleness/max": float(stale.max())}


class Clock:
    """Busy seconds of one phase, summed across threads' calls; `lap()` gives those since the last lap."""

    def __init__(self):
        self._lock = threading.Lock()
        self._total = self._lapped = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._total += seconds

    def lap(self) -> float:
        with self._lock:
            out, self._lapped = self._total - self._lapped, self._total
        return out


class Pipeline(Generic[Result]):
    """The batches in flight of a run at `max_staleness = k >= 1` (module docstring), and the judge's worker.

    `batches` is the run's prompt pipeline (grain); `reward(sampled, step, trace)` rewards a batch (the trainer's
    `Draw`); `inline`: why the reward runs on the trainer's thread ("" = on the worker). `get_state` / `set_state`
    make it the checkpoint's data iterator: the prompt pipeline's state and the batches in flight.
    """

    def __init__(self, k: int, batches, reward: Callable[[Sampled, int, bool], Result], *, inline: str = "",
                 mesh: jax.sharding.Mesh | None = None):
        self.k, self.batches, self._reward, self.inline, self.mesh = k, batches, reward, inline, mesh
        self.sampled: dict[int, Sampled] = {}  # by the step that learns from it
        self.futures: dict[int, concurrent.futures.Future] = {}
        self.judge_clock = Clock()
        self.restored: dict[int, Sampled] = {}
        # (phase, step, 'start' | 'end') in the order they happened, from both threads: what ran beside what
        self.timeline: list[tuple[str, int, str]] = []
        self._timeline_lock = threading.Lock()
        self._worker = None if inline else concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="judge")

    def _judge(self, sampled: Sampled, step: int, trace: bool) -> Result:
        start = time.perf_counter()
        fault_points.reached("judge", step)
        try:
            with self.phase("judge", step):
                if self.mesh is None:
                    return self._reward(sampled, step, trace)
                with jax.set_mesh(self.mesh):
                    return self._reward(sampled, step, trace)
        finally:
            self.judge_clock.add(time.perf_counter() - start)

    @contextlib.contextmanager
    def phase(self, name: str, step: int):
        """Mark `name`'s start and end for step `step` on the `timeline`."""
        with self._timeline_lock:
            self.timeline.append((name, step, "start"))
        try:
            yield
        finally:
            with self._timeline_lock:
                self.timeline.append((name, step, "end"))

    def submit(self, sampled: Sampled, step: int, trace: bool) -> concurrent.futures.Future:
        """Hand `sampled` to the judge, as batch `step`'s rewards when `step` is given to `put`."""
        if self._worker is not None:
            return self._worker.submit(self._judge, sampled, step, trace)
        future = concurrent.futures.Future()
        future.set_result(self._judge(sampled, step, trace))
        return future

    def put(self, step: int, sampled: Sampled, trace: bool) -> None:
        """Batch `step` sampled: judge it."""
        self.sampled[step] = sampled
        self.futures[step] = self.submit(sampled, step, trace)

    def take(self, step: int) -> Result:
        """Batch `step`'s rewards, once judged (waiting for it); it leaves the pipeline."""
        draw = self.futures.pop(step).result()
        del self.sampled[step]
        return draw

    def judge_now(self, sampled: Sampled, step: int, trace: bool) -> Result:
        """`sampled` rewarded as part of step `step`, after everything handed over before it."""
        return self.submit(sampled, step, trace).result()

    def drain(self) -> None:
        """Wait until every batch handed over is judged (its result kept for `take`)."""
        concurrent.futures.wait(list(self.futures.values()))

    def close(self) -> None:
        """Stop the worker (what is queued is dropped; a call running finishes)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)

    # -- the checkpoint's data iterator ----------------------------------------------------------------------

    def get_state(self) -> dict:
        """The prompt pipeline's state and every host's batches in flight (collective)."""
        return in_flight_state(self.batches, self.sampled)

    def set_state(self, state: dict) -> None:
        """Restore `get_state()`'s: the prompt pipeline, and this host's batches in flight into `restored`; or a
        synchronous run's state (the prompt pipeline's alone), with nothing in flight (module docstring)."""
        self.restored = restore_in_flight(self.batches, state)


class Backlog:
    """The checkpointable data iterator of a synchronous run (k = 0): the prompt pipeline (`batches`), and the
    batches that a checkpoint written at k >= 1 held in flight (`ahead`, by the step that learns from them).

    Resumed at k = 0 from such a checkpoint, a run learns from those batches at their steps as the asynchronous run
    would have: judged then, learned from against their behaviour policy, their staleness logged (dynamic sampling's
    further draws are sampled at the step, as the asynchronous step's are). The prompt pipeline, which gave them
    already, then gives the batches after them: nothing sampled is dropped, no prompt skipped or repeated. From the
    step after the last of them every step samples its own batch. While some remain, a checkpoint keeps them as
    the asynchronous run's does (`Pipeline.get_state`), so that a later resume at any k finds them; without any,
    its state is the prompt pipeline's alone, as ever at k = 0.
    """

    def __init__(self, batches):
        self.batches = batches
        self.ahead: dict[int, Sampled] = {}

    def take(self, step: int) -> Sampled | None:
        """Batch `step` when the checkpoint held it in flight (it leaves the backlog), else None."""
        return self.ahead.pop(step, None)

    def get_state(self) -> dict:
        """The prompt pipeline's state, with every host's batches still ahead while there are some (collective)."""
        return in_flight_state(self.batches, self.ahead) if self.ahead else self.batches.get_state()

    def set_state(self, state: dict) -> None:
        """Restore a synchronous run's state or an asynchronous run's (`Pipeline.get_state`), this host's batches
        in flight then `ahead`."""
        self.ahead = restore_in_flight(self.batches, state)


def in_flight_state(batches, sampled: dict[int, Sampled]) -> dict:
    """The checkpoint state of the prompt pipeline `batches` and of every host's batches `sampled` ahead, by the
    step that learns from them (collective: every host gives the same steps)."""
    mine = json.dumps({str(s): x.record() for s, x in sorted(sampled.items())}, allow_nan=False)
    return {"batches": batches.get_state(), "in_flight": distributed.gather_texts([mine])}


def restore_in_flight(batches, state: dict) -> dict[int, Sampled]:
    """Restore the prompt pipeline `batches` from a checkpoint state, an asynchronous run's (`in_flight_state`) or
    a synchronous run's (the pipeline's own); returns this host's batches in flight by step (none for the latter)."""
    if not (isinstance(state, dict) and state.keys() == {"batches", "in_flight"}):
        batches.set_state(state)
        return {}
    batches.set_state(state["batches"])
    mine = json.loads(state["in_flight"][jax.process_index()])
    return {int(s): Sampled.of_record(r) for s, r in mine.items()}


def in_flight_steps(step: int, k: int, steps: int) -> range:
    """The batches in flight while step `step` learns: step + 1 .. step + k, none past the run's `steps`."""
    return range(step + 1, min(step + k, steps) + 1)


def overlap_refusal(settings, mesh: jax.sharding.Mesh) -> str:
    """Why the reward of a run cannot run beside its trainer's thread ("" when it can; module docstring)."""
    remote = bool(settings.reward_service) or settings.inference.engine != "jax"
    in_process = bool(settings.reward_roles) and not remote  # a judge or a DRM on the policy's mesh
    if jax.process_count() > 1 and not settings.reward_service:
        return "on several hosts its judge's host collectives must keep one order beside the trainer's"
    if in_process and mesh.size > 1 and not settings.mesh.judge_devices:
        return (f"its models share the policy's {mesh.size} devices, where two threads would launch programs in "
                "different orders; give the judge devices of its own (mesh.judge_devices), serve it "
                "(inference.engine='openai') or run the reward service")
    return ""

