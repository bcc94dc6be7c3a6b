"""The asynchronous step (`rl.max_staleness`): the behaviour policy carried with sampled groups, the batches in flight
as a checkpoint keeps them, the schedule's staleness, and exact resume after a SIGKILL in any phase."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_args, read_metrics, tiny_config
from rrc_jax.config import validate
from rrc_jax.fault_points import ENV
from rrc_jax.rl.pipeline import Pipeline, Sampled, in_flight_steps, staleness_metrics
from rrc_jax.rl.rollout import Groups
from rrc_jax.rl.trainer import run
from test_faults import assert_same_metrics

REPO = Path(__file__).resolve().parents[1]


def groups_of_two() -> Groups:
    return Groups([["ab", "c"]], [[5, 6, 7]], [np.array([3, 4], np.int32), np.array([9], np.int32)],
                  np.array([False, True]))


def test_the_behaviour_log_probs_go_back_to_their_tokens_positions():
    """Read at the loss positions of one padding and written back at those of another (the batch of a merged step
    may pad longer), each log-prob lands on its own token; elsewhere old_logp is 0."""
    groups = groups_of_two()
    batch = groups.batch(pad_id=0)
    logp = np.arange(batch["ids"].size, dtype=np.float32).reshape(batch["ids"].shape) / 7
    behaved = groups.with_behaviour(logp, batch["loss_mask"], version=3)
    assert [list(x) for x in behaved.logprobs] == [list(logp[0, 3:5]), list(logp[1, 3:4])]
    again = behaved.batch(pad_id=0)
    mask = again["loss_mask"].astype(bool)
    np.testing.assert_array_equal(again["old_logp"][mask], logp[batch["loss_mask"].astype(bool)])
    assert not again["old_logp"][~mask].any()
    assert list(behaved.versions) == [3, 3]
    taken = Groups.concat([behaved.take([0]), behaved.take([0])])
    assert len(taken.logprobs) == 4 and list(taken.versions) == [3] * 4
    assert Groups.concat([behaved, groups]).logprobs is None  # a part without a behaviour policy: none


def test_a_batch_in_flight_survives_its_json_record_exactly():
    groups = groups_of_two()
    batch = groups.batch(pad_id=0)
    logp = np.random.default_rng(0).normal(size=batch["ids"].shape).astype(np.float32)
    sampled = Sampled(np.array([11]), ["the prompt"], groups.with_behaviour(logp, batch["loss_mask"], 2),
                      {"anchors": [["x", "y"]]}, 0.5, 3)
    back = Sampled.of_record(json.loads(json.dumps(sampled.record(), allow_nan=False)))
    assert back.groups.texts == groups.texts and back.groups.prompt_ids == groups.prompt_ids
    for a, b in zip(back.groups.logprobs, sampled.groups.logprobs):
        assert a.dtype == np.float32 and a.tobytes() == b.tobytes()
    for a, b in zip(back.groups.responses, groups.responses):
        np.testing.assert_array_equal(a, b)
    assert list(back.groups.truncated) == [False, True] and back.inputs == sampled.inputs
    assert list(back.prompt_index) == [11] and back.sampled_tokens == 3
    bare = dataclasses.replace(sampled, inputs=None)  # a construction that prepares nothing
    assert Sampled.of_record(json.loads(json.dumps(bare.record()))).inputs is None


def test_the_schedules_staleness():
    assert list(in_flight_steps(0, 2, 10)) == [1, 2] and list(in_flight_steps(9, 2, 10)) == [10]
    behaved = groups_of_two().with_behaviour(np.zeros((2, 8), np.float32), np.ones((2, 8)), version=4)
    assert staleness_metrics(behaved, step=6) == {"staleness/mean": 1.0, "staleness/max": 1.0}


def test_a_checkpoints_batches_in_flight_restore_at_any_staleness():
    """The data item of a checkpoint written at k = 1 (the prompt pipeline and batch 2 in flight), restored at k = 0
    (`Backlog`): the pipeline where it was and batch 2 ahead, kept in the checkpoints written until its step takes
    it, the pipeline's state alone after. A k = 0 checkpoint's item restored at k = 1: the pipeline, nothing in
    flight."""
    from rrc_jax.data.prompts import prompt_batches
    from rrc_jax.rl.pipeline import Backlog

    groups = groups_of_two()
    batch = groups.batch(pad_id=0)
    ahead = Sampled(np.array([7]), ["p"], groups.with_behaviour(np.ones(batch["ids"].shape, np.float32),
                                                                batch["loss_mask"], 0), None, 0.1, 3)
    batches = prompt_batches(4, 0, 64)
    async_run = Pipeline(1, batches, lambda *a: None, inline="a test")
    next(batches), next(batches)  # batches 1 and 2
    async_run.sampled[2] = ahead
    state = json.loads(json.dumps(async_run.get_state()))  # as a checkpoint holds it
    later = next(batches)

    sync = Backlog(prompt_batches(4, 0, 64))
    sync.set_state(state)
    assert sorted(sync.ahead) == [2] and sync.ahead[2].record() == ahead.record()
    assert json.loads(json.dumps(sync.get_state())) == state  # kept while it is ahead
    np.testing.assert_array_equal(next(sync.batches), later)  # the pipeline gave batch 2 already
    assert sync.take(1) is None and sync.take(2).record() == ahead.record() and sync.take(2) is None
    assert sync.get_state() == sync.batches.get_state()  # a synchronous run's own state once none is ahead

    plain = Backlog(prompt_batches(4, 0, 64))
    next(plain.batches)
    resumed = Pipeline(1, prompt_batches(4, 0, 64), lambda *a: None, inline="a test")
    resumed.set_state(json.loads(json.dumps(plain.get_state())))
    assert resumed.restored == {}
    np.testing.assert_array_equal(next(resumed.batches), next(plain.batches))


@pytest.mark.parametrize("before, after", [(1, 0), (2, 1)])
def test_batches_in_flight_are_learned_from_when_a_resume_lowers_max_staleness(before, after, tmp_path, toy_cache,
                                                                              capfd):
    """A DRM run at k = `before` checkpointed after step 1 (batches 2..1 + k in flight), resumed at a smaller k with
    `resume.allow_changes`: steps 2..1 + k learn from the batches the checkpoint held (none sampled again, none
    dropped), so every step's metrics are the uninterrupted run's."""
    import shutil

    overrides = {"steps": 1 + before, "rl.max_staleness": before, "checkpoint.save_every": 1, "checkpoint.keep": 3,
                 "eval.every": 0}
    workdir = tmp_path / "run"
    straight = read_metrics(run(validate(tiny_config("drm", workdir, toy_cache, **overrides))))
    for step in range(2, 2 + before):
        shutil.rmtree(workdir / "checkpoints" / str(step))
    rows = read_metrics(run(validate(tiny_config("drm", workdir, toy_cache, **{
        **overrides, "rl.max_staleness": after, "resume.allow_changes": True}))))
    assert "resumed from the checkpoint of step 1" in capfd.readouterr().err
    assert_same_metrics(straight, rows)
    assert rows[1 + before]["staleness/max"] == before


STALE_RUN = {"steps": 5, "rl.max_staleness": 1, "checkpoint.save_every": 2, "eval.every": 2,
             "rl.dynamic_sampling": True, "rl.max_draws": 2}


@pytest.fixture(scope="module")
def stale_run(tmp_path_factory, toy_cache):
    """An uninterrupted SCR run at k = 1 (the judge in this process on one device, so on the worker thread) with
    dynamic sampling (a step's second draw sampled when it waits for its rewards): 5 steps, checkpoints at 2 and 4;
    its metrics by step."""
    return read_metrics(run(validate(tiny_config("scr", tmp_path_factory.mktemp("stale"), toy_cache, **STALE_RUN))))


def test_one_step_stale_rollouts_train_with_their_staleness(stale_run):
    """Step 1 learns from rollouts of the initial weights, every later step from its pipelined batch, one update
    old, and from the groups of a second draw sampled when it waits (fresh: staleness 0) where the first had too
    few groups whose rewards differ; the judge's busy and idle seconds and the trainer's wait are logged."""
    assert stale_run[1]["staleness/max"] == 0
    for s in (2, 3, 4, 5):
        mean, draws = stale_run[s]["staleness/mean"], stale_run[s]["data/draws_per_step"]
        assert mean == 1.0 if draws == 1 else 0.0 <= mean <= 1.0
    assert any(0 < stale_run[s]["staleness/mean"] < 1 for s in (2, 3, 4, 5))  # a fresh draw beside a stale batch
    assert all(stale_run[s]["time/judge_busy"] > 0 and stale_run[s]["time/judge_idle"] >= 0
               and stale_run[s]["time/learner_wait"] >= 0 for s in range(1, 6))


@pytest.mark.slow
def test_the_first_stale_step_learns_what_the_synchronous_step_does(tmp_path, toy_cache):
    """Step 1 at k = 1 samples the prompts, keys and weights k = 0 does, so its rewards are k = 0's; later steps
    sample from weights one update older."""
    overrides = {"steps": 3, "eval.every": 0, "checkpoint.save_every": 0}
    sync = read_metrics(run(validate(tiny_config("scr", tmp_path / "k0", toy_cache, **overrides))))
    k1 = read_metrics(run(validate(tiny_config("scr", tmp_path / "k1", toy_cache, **overrides,
                                               **{"rl.max_staleness": 1}))))
    assert k1[1]["reward/mean"] == sync[1]["reward/mean"]
    assert k1[2]["reward/mean"] != sync[2]["reward/mean"] or k1[3]["reward/mean"] != sync[3]["reward/mean"]
    assert "staleness/mean" not in sync[2]


@pytest.mark.parametrize("fault", ["judge:5", pytest.param("update:4", marks=pytest.mark.slow),
                                   pytest.param("save:4", marks=pytest.mark.slow)])
def test_a_sigkill_in_any_phase_resumes_to_the_uninterrupted_metrics(fault, stale_run, tmp_path, toy_cache):
    """SIGKILLed while the judge works on batch 5 (during step 4), during step 4's update, or while step 4's
    checkpoint is written, then rerun: it resumes from step 2's checkpoint, which holds batch 3 in flight, and the
    metrics of every step equal the uninterrupted run's."""
    killed = tmp_path / "killed"
    cmd = cli_args(killed, toy_cache, kind="scr", **STALE_RUN)
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env={**os.environ, ENV: fault})
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    assert not (killed / "hf_export").exists()
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from the checkpoint of step 2" in resumed.stderr
    assert_same_metrics(stale_run, read_metrics(killed))


JUDGE_ON_ITS_OWN_DEVICES = """
import json, sys
sys.path.insert(0, {tests!r})
from conftest import tiny_config
from rrc_jax.config import validate
from rrc_jax.rl.trainer import Trainer
settings = validate(tiny_config("scr", {workdir!r}, {cache!r}, **{{"steps": 3, "rl.max_staleness": 1,
    "mesh.judge_devices": 4, "eval.every": 0, "checkpoint.save_every": 0}}))
trainer = Trainer(settings)
trainer.run()
grm = trainer.roles.model("grm")
print(json.dumps({{"timeline": trainer.pipeline.timeline, "inline": trainer.pipeline.inline,
                  "policy": sorted(d.id for d in trainer.mesh.devices.flat),
                  "judge": sorted({{d.id for x in __import__("jax").tree.leaves(__import__("flax").nnx.state(grm))
                                    for d in x.sharding.device_set}})}}))
"""


def test_the_judge_on_its_own_devices_judges_while_the_policy_samples(tmp_path, toy_cache):
    """8 CPU devices, the judge (the GRM) on the last 4 (`mesh.judge_devices=4`), the policy on the first 4, k = 1:
    the judge works on the worker thread, and the order of the two threads' events shows the judging of one batch
    under way while the next batch is sampled and the step before learns (the order, not the times)."""
    from conftest import cpu_devices_env

    script = JUDGE_ON_ITS_OWN_DEVICES.format(tests=str(REPO / "tests"), workdir=str(tmp_path / "run"),
                                             cache=str(toy_cache))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, cwd=REPO,
                         env=cpu_devices_env(8))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["inline"] == "" and got["policy"] == [0, 1, 2, 3] and got["judge"] == [4, 5, 6, 7]
    at = {tuple(event): i for i, event in enumerate(got["timeline"])}  # each event's place in the order
    span = lambda phase, step: (at[(phase, step, "start")], at[(phase, step, "end")])  # noqa: E731
    for step in (2, 3):  # batch `step`, judged while the policy samples the next batch or learns from the last
        start, end = span("judge", step)
        beside = [(phase, s) for phase, s, edge in got["timeline"] if edge == "start" and phase != "judge"
                  and span(phase, s)[0] < end and span(phase, s)[1] > start]
        assert beside, (step, got["timeline"])


def test_judge_devices_without_a_reward_model_in_the_trainer_are_refused():
    """`mesh.judge_devices` for a reward that loads no GRM or DRM in this process (a served reward, a served judge,
    a plug-in function) is one line naming why and the fix; a judge or a DRM in process keeps them."""
    from rrc_jax.config import base_config
    from rrc_jax.errors import ConfigError

    def settings(kind, **overrides):
        config = base_config(kind)
        config.update_from_flattened_dict({"mesh.judge_devices": 2, **overrides})
        return validate(config)

    assert settings("agr").mesh.judge_devices == 2 and settings("drm").mesh.judge_devices == 2
    served = {"reward.service_url": "http://127.0.0.1:9", "eval.judge_votes": 0, "reward.agr.refresh_every": 0}
    for kind, overrides, why in [
            ("agr", served, "the reward service at reward.service_url judges"),
            ("scr", {"inference.engine": "openai", "inference.url": "http://127.0.0.1:9"},
             "inference.engine='openai': its server judges"),
            ("rlvr", {"data.format": "pairs"}, "reward.kind='rlvr' loads no GRM or DRM")]:
        with pytest.raises(ConfigError) as e:
            settings(kind, **overrides)
        assert str(e.value) == (f"config.mesh.judge_devices=2: no reward model runs in this trainer ({why}), so the "
                                "devices set aside for it would sit idle; set mesh.judge_devices=0")


@pytest.mark.slow
def test_agr_refreshing_its_anchors_one_step_ahead_resumes_exactly(tmp_path, toy_cache):
    """k = 1 with anchors refreshed before steps 3 and 5: batch 5's anchors are refreshed when it is sampled, during
    step 4, from the weights of 3 updates. Killed during step 5's update, the run resumes from step 4's checkpoint
    (batch 5 in flight with its anchors) and reads the step-5 anchors back for batch 6: the metrics of every step
    equal the uninterrupted run's."""
    overrides = {"steps": 6, "rl.max_staleness": 1, "reward.agr.refresh_every": 2, "checkpoint.save_every": 2,
                 "eval.every": 3, "reward.judge.temperature": 1.0}
    straight = read_metrics(run(validate(tiny_config("agr", tmp_path / "straight", toy_cache, **overrides))))
    killed = tmp_path / "killed"
    cmd = cli_args(killed, toy_cache, **overrides)
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                           env={**os.environ, ENV: "update:5"})
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from the checkpoint of step 4" in resumed.stderr
    assert_same_metrics(straight, read_metrics(killed))
