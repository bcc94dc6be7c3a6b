"""Alarms: warnings about a run that spends its compute on no learning signal.

A GRPO step learns only from responses whose rewards differ within their group. Three ways a run can train on
nothing, or pay twice for the same signal, without failing:

- the judge abstains (no parseable verdict or score) on most of the questions it answered: its rewards fall back to
  ties (questions a served judge left unanswered, `judge/unanswered_questions`, are not blamed on the template: they
  warn as such, and stop the run past `inference.max_failed_fraction`, `rrc_jax.rl.guard`);
- every group's reward is flat for several steps in a row: every advantage is zero (`reward/zero_signal`);
- `votes > 1` with a greedy judge: repeated votes in the same A/B order are identical (the engine answers each
  question once), so they add nothing.

Each alarm warns once per run, on stderr (process 0), with the number and what to change. The per-step signal is
in the metrics either way: `reward/flat_groups` (share of groups with equal rewards) and `reward/zero_signal` (1
when every group is flat; their sum over `metrics.jsonl` counts zero-signal steps).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import numpy as np

from rrc_jax.inference.openai_engine import failure_text
from rrc_jax.progress import say
from rrc_jax.settings import field_error


@dataclasses.dataclass(frozen=True)
class AlarmConfig:
    """When a run is told it learns nothing (`log`): a warning once the judge abstains on more than `abstain_alarm`
    of a step's questions, or every group is flat for `flat_alarm_steps` steps in a row (0: never); a stop (exit
    status 3, `rrc_jax.rl.guard`) when it abstains on more than `abstain_abort` (0: off) for that many steps."""

    GROUP: ClassVar[str] = "log"
    abstain_alarm: float = 0.5
    abstain_abort: float = 0.9
    flat_alarm_steps: int = 3

    def __post_init__(self):
        for name in ("abstain_alarm", "abstain_abort"):
            if not 0 <= getattr(self, name) <= 1:
                raise field_error("log", name, f"{getattr(self, name)} must be in [0, 1] (a share of the judge's "
                                  "questions)")
        if self.flat_alarm_steps < 0:
            raise field_error("log", "flat_alarm_steps", f"{self.flat_alarm_steps} must be >= 0 (0 = off)")


def signal_metrics(rewards: np.ndarray) -> dict[str, float]:
    """`reward/flat_groups` and `reward/zero_signal` of one step's rewards `[B, m]`."""
    rewards = np.asarray(rewards, np.float64)
    flat = np.ptp(rewards, axis=1) == 0 if rewards.size else np.zeros(0, bool)
    return {"reward/flat_groups": float(flat.mean()) if flat.size else math.nan,
            "reward/zero_signal": float(flat.all()) if flat.size else math.nan}


def config_warnings(judge, eval_votes: int, uses_judge: bool) -> list[str]:
    """Warnings about a trainer config that are not errors (greedy repeated votes), for a run whose reward asks
    the judge (`uses_judge`; `judge`: its `JudgeSettings`, `eval_votes`: `eval.judge_votes`)."""
    distinct = 2 if judge.swap else 1  # a greedy judge's distinct votes on a pair: one per A/B order shown
    out = []
    for field, votes in (("reward.judge.votes", judge.votes), ("eval.judge_votes", eval_votes)):
        if uses_judge and judge.temperature == 0 and votes > distinct:
            out.append(f"warning: {field}={votes} with a greedy judge (reward.judge.temperature=0): at most "
                       f"{distinct} of the {votes} votes per pair can differ, the rest repeat them and add nothing; "
                       f"set reward.judge.temperature > 0 or {field}={distinct}")
    return out


class Alarms:
    """`check(step, metrics)` after each step (the step's reduced metrics): warns once per alarm (module
    docstring). `abstain_alarm`: the abstention rate above which it warns; `flat_steps`: consecutive zero-signal
    steps before it warns (0: never)."""

    def __init__(self, abstain_alarm: float, flat_steps: int, workdir: str = "the workdir"):
        self.abstain_alarm, self.flat_steps, self.workdir = abstain_alarm, flat_steps, workdir
        self.flat_run: list[int] = []
        self.raised: set[str] = set()

    def _warn(self, name: str, message: str) -> None:
        if name not in self.raised:
            self.raised.add(name)
            say(f"warning: {message}")

    def check(self, step: int, metrics: dict) -> None:
        questions, failed = metrics.get("judge/questions", 0), metrics.get("judge/unanswered_questions", 0)
        if metrics.get("judge/failed_requests", 0):
            self._warn("server", f"step {step}: the judge server left {int(metrics['judge/failed_requests'])} of "
                                 f"{int(metrics.get('judge/requests', 0))} requests unanswered ("
                                 f"{failure_text({k[6:]: v for k, v in metrics.items() if k.startswith('judge/')})}"
                                 f"), {int(failed)} questions; they count as abstentions (judge/failed_requests)")
        answered = questions - failed  # a question left unanswered is the server's failure, not the template's
        rate = (metrics.get("judge/abstain_rate", math.nan) * questions - failed) / answered if answered else math.nan
        if rate > self.abstain_alarm:
            self._warn("abstain", f"step {step}: the judge abstained on {rate:.0%} of its {int(answered)} "
                                  f"{'answered ' if failed else ''}questions (log.abstain_alarm="
                                  f"{self.abstain_alarm}); abstentions score as ties, so these rewards carry little "
                                  f"signal. Read the judgments in {self.workdir}/samples/: check that "
                                  "reward.judge.template is the format the GRM was trained on and that "
                                  "reward.judge.max_new_tokens leaves room for the verdict"
                                  + ("" if metrics.get("judge/forced_verdicts") is not None else
                                     "; a judge that writes no verdict can be read one: "
                                     "reward.judge.force_verdicts=True"))
        self.flat_run = self.flat_run + [step] if metrics.get("reward/zero_signal") == 1.0 else []
        if self.flat_steps and len(self.flat_run) >= self.flat_steps:
            self._warn("flat", f"every group's reward was flat for {len(self.flat_run)} steps in a row (steps "
                               f"{self.flat_run[0]}-{step}): every advantage is zero and the policy does not "
                               "learn. Raise rl.group_size or rl.temperature for more varied responses, or check "
                               f"the reward in {self.workdir}/samples/ (reward/zero_signal counts such steps)")
