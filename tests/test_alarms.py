"""The zero-signal metrics and the run's alarms (`rrc_jax.rl.alarms`), on hand-made steps."""

import math

import numpy as np

from rrc_jax.rl.alarms import Alarms, signal_metrics


def test_flat_groups_and_zero_signal():
    assert signal_metrics(np.array([[1.0, 1.0], [0.0, 2.0]])) == {"reward/flat_groups": 0.5,
                                                                  "reward/zero_signal": 0.0}
    assert signal_metrics(np.zeros((3, 4))) == {"reward/flat_groups": 1.0, "reward/zero_signal": 1.0}
    empty = signal_metrics(np.zeros((0, 4)))  # a host without prompts of its own
    assert all(math.isnan(v) for v in empty.values())


def test_each_alarm_warns_once_and_only_past_its_threshold(capsys):
    alarms = Alarms(abstain_alarm=0.5, flat_steps=3, workdir="w")
    alarms.check(1, {"judge/abstain_rate": 0.5, "judge/questions": 10, "reward/zero_signal": 1.0})
    alarms.check(2, {"judge/abstain_rate": math.nan, "reward/zero_signal": 1.0})
    alarms.check(3, {"reward/zero_signal": 0.0})  # a step with signal restarts the count
    alarms.check(4, {"reward/zero_signal": 1.0})
    alarms.check(5, {"reward/zero_signal": 1.0})
    assert capsys.readouterr().err == ""
    alarms.check(6, {"judge/abstain_rate": 0.75, "judge/questions": 8, "reward/zero_signal": 1.0})
    alarms.check(7, {"judge/abstain_rate": 0.9, "judge/questions": 8, "reward/zero_signal": 1.0})
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].startswith("warning: step 6: the judge abstained on 75% of its 8 questions (log.abstain_alarm=0.5)")
    assert err[1].startswith("warning: every group's reward was flat for 3 steps in a row (steps 4-6)")
    assert "w/samples/" in err[0] and "w/samples/" in err[1]


def test_flat_alarm_off():
    alarms = Alarms(abstain_alarm=1.0, flat_steps=0)
    for step in range(1, 10):
        alarms.check(step, {"judge/abstain_rate": 1.0, "reward/zero_signal": 1.0})
    assert alarms.raised == set()
