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


def _guard(**rl):
    from flax import nnx

    from rrc_jax.rl.guard import DivergenceGuard, GuardConfig

    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    guard = GuardConfig(**{"max_skipped_fraction": 0.5, "guard_window": 3, "max_param_growth": 10.0, **rl})
    return DivergenceGuard(guard, updates_per_step=2, steps=40, model=model, abstain_abort=0.0,
                           abstain_steps=2), model


def test_guard_stops_on_skipped_updates_over_its_window():
    import pytest

    from rrc_jax.errors import Diverged

    guard, model = _guard()
    for step, skipped in enumerate([2, 1, 0, 0, 2], start=1):  # windows: 3/6, 1/6, 2/6 of the updates
        guard.check(step, {"skipped_updates": skipped}, model)
    with pytest.raises(Diverged, match=r"step 6: 67% of the updates of the last 3 steps were skipped"):
        guard.check(6, {"skipped_updates": 2}, model)


def test_guard_stops_on_exploded_or_non_finite_parameters_and_an_abstaining_judge():
    import jax.numpy as jnp
    import pytest

    from rrc_jax.errors import Diverged

    guard, model = _guard()
    guard.check(1, {}, model)
    model.kernel.value = model.kernel.value * 11.0
    with pytest.raises(Diverged, match="step 2: the policy's parameter norm grew"):
        guard.check(2, {}, model)
    model.kernel.value = model.kernel.value.at[0, 0].set(jnp.nan)
    with pytest.raises(Diverged, match="step 3: the policy has non-finite parameters"):
        guard.check(3, {}, model)
    guard, model = _guard()
    guard.abstain_abort = 0.9
    guard.check(1, {"judge/abstain_rate": 0.95}, model)
    guard.check(2, {"judge/abstain_rate": 0.5}, model)  # not in a row
    guard.check(3, {"judge/abstain_rate": 0.95}, model)
    with pytest.raises(Diverged, match="abstained on more than log.abstain_abort=0.9 of its questions for 2 steps"):
        guard.check(4, {"judge/abstain_rate": 1.0}, model)
