"""Several slices joined by the data-center network (`mesh.dcn`, `rrc_jax.sharding.hybrid_mesh`): the hybrid mesh's
device order on stand-in devices, its errors, which collectives of the compiled programs cross slices
(`slices_hlo.py`), two processes on the loopback training as two slices (each process a slice: CPU devices have no
slice index) to the one-slice run's metrics and resuming exactly after a SIGKILL, and the planner's `--slices`."""

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import cpu_devices_env, read_metrics
from test_faults import assert_same_metrics
from test_multihost import _kill_past_checkpoint, _launch, _logs, _wait

from rrc_jax import plan, sharding
from rrc_jax.errors import ConfigError

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Chip:
    """A stand-in device: a slice index (`process_index` for devices that report none), as JAX's devices carry."""

    id: int
    process_index: int
    slice_index: int = 0
    platform: str = "cpu"
    device_kind: str = "cpu"


@pytest.mark.parametrize("ici, dcn", [((1, 2, 2), (2, 1, 1)), ((2, 2, 1), (1, 2, 1)), ((1, 4, 2), (3, 1, 1)),
                                      ((2, 1, 1), (2, 2, 1))])
def test_hybrid_mesh_puts_slices_outermost_and_keeps_each_slice_whole(ici, dcn):
    per, n = int(np.prod(ici)), int(np.prod(dcn))
    chips = [Chip(i, i // per) for i in range(per * n)]
    random.Random(0).shuffle(chips)  # the order devices come in does not matter: their slice does
    mesh = sharding.hybrid_devices(ici, dcn, chips, by_process=True)
    assert mesh.shape == tuple(i * d for i, d in zip(ici, dcn))
    slices = np.vectorize(lambda c: c.process_index)(mesh)
    for index in np.ndindex(mesh.shape):  # index i of axis a lies in slice block i // ici[a]
        block = tuple(i // k for i, k in zip(index, ici))
        assert slices[index] == np.ravel_multi_index(block, dcn)
    for s in range(n):  # each slice's devices in its own order, as one block
        block = mesh[tuple(slice(b * k, (b + 1) * k) for b, k in zip(np.unravel_index(s, dcn), ici))]
        assert sorted(c.id for c in block.flat) == list(range(s * per, (s + 1) * per))


def test_a_devices_slice_is_its_tpu_slice_index_else_its_process():
    assert sharding.device_slice(Chip(0, process_index=3, slice_index=1, platform="tpu"), by_process=True) == 1
    assert sharding.device_slice(Chip(0, process_index=3), by_process=True) == 3
    assert sharding.device_slice(Chip(0, process_index=3), by_process=False) == 0  # `auto`: one slice on CPU, GPU


def test_slices_that_do_not_match_the_mesh_are_config_errors():
    with pytest.raises(ConfigError, match="slices hold 4, 2 devices"):
        sharding.hybrid_devices((1, 4, 1), (2, 1, 1), [Chip(i, int(i >= 4)) for i in range(6)], by_process=True)
    with pytest.raises(ConfigError, match=r"needs 4 slices of 4 devices, but the devices are 2 slices of 4"):
        sharding.hybrid_devices((1, 4, 1), (4, 1, 1), [Chip(i, i // 4) for i in range(8)], by_process=True)
    with pytest.raises(ConfigError, match="needs 3 slices, but 2 are available"):
        sharding.dcn_shape("3,1,1", 2)
    assert sharding.dcn_shape("auto", 4) == (4, 1, 1) and sharding.dcn_shape("1,-1,1", 4) == (1, 4, 1)
    with pytest.raises(ConfigError, match="tensor parallelism across slices"):
        sharding.MeshConfig(dcn="1,1,2")
    with pytest.raises(ConfigError, match="give 'auto'"):
        sharding.MeshConfig(dcn="2x1")


def test_only_the_gradients_cross_slices_in_the_compiled_programs():
    """On two slices of 4 devices (data across them, fsdp inside): the rollout copy's reshard sends nothing between
    slices; decoding in the inference layout (rows across slices, tensor inside) only each step's few bytes a row of
    bookkeeping; the update, with or without micro-batches, one all-reduce of each device's gradient shard (the
    planner's `gradients over DCN`) and of a few scalars (loss, weights, metrics), outside every loop: once per
    update."""
    out = subprocess.run([sys.executable, str(HERE / "slices_hlo.py")], env=cpu_devices_env(8), capture_output=True,
                         text=True, timeout=600, cwd=HERE)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr[-3000:]
    got = {x["program"]: x for x in map(json.loads, out.stdout.splitlines()[:-1])}
    assert got["sync"]["crossing"] == []
    assert got["decode"]["crossing"] and all(c["bytes"] <= 16 * 2 * 4 for c in got["decode"]["crossing"])
    for name in ("update", "update micro"):
        crossing = got[name]["crossing"]
        assert all(c["op"] == "all-reduce" and c["depth"] == 0 for c in crossing), crossing
        gradients = got[name]["gradient_bytes"]  # a device's float32 parameters (`plan.param_bytes`)
        assert gradients <= sum(c["bytes"] for c in crossing) <= gradients + 256, crossing


def test_two_slices_train_as_one_slice_and_resume_exactly_after_sigkill(tmp_path, toy_cache):
    """Two processes of 4 devices as two slices (`mesh.dcn=2,1,1`: data across them, fsdp over each one's 4), killed
    past their step-2 checkpoint and rerun, give every numeric metric of every step (rewards, losses, gradient
    norms, judge counts, fidelity, held-out quality, memory per device; the wall-clock ones aside) of the two
    processes run as one slice on the same 8 devices (`mesh.data=2`, the same shape)."""
    common = {"steps": 3, "checkpoint.save_every": 2, "eval.every": 2, "eval.judge_votes": 0}
    one, two = tmp_path / "one", tmp_path / "two"
    assert _wait(_launch(one, toy_cache, 2, 4, **common, **{"mesh.data": 2})) == [0, 0], _logs(one)[-3000:]
    _kill_past_checkpoint(_launch(two, toy_cache, 2, 4, **common, **{"mesh.dcn": "2,1,1"}), two, 2)
    assert not (two / "checkpoints" / "3").exists(), _logs(two)[-3000:]
    assert _wait(_launch(two, toy_cache, 2, 4, **common, **{"mesh.dcn": "2,1,1"})) == [0, 0], _logs(two)[-3000:]
    logs = _logs(two)
    assert "resumed from the checkpoint of step 2" in logs and "2 slices" in logs
    assert sorted(read_metrics(two)) == [0, 1, 2, 3]
    assert_same_metrics(read_metrics(one), read_metrics(two))


RECIPE = {"models.policy": "llama3-8b", "models.grm": "llama3-8b", "rl.group_size": 8, "reward.agr.n_anchors": 8,
          "reward.judge.votes": 8, "reward.judge.template": "rrc_pairwise_cot", "reward.judge.max_new_tokens": 1024,
          "rl.max_new_tokens": 1024, "rl.prompts_per_step": 32, "models.dtype": "bfloat16"}


def _settings(**overrides):
    from rrc_jax.config import validate
    from rrc_jax.configs import agr

    config = agr.get_config()
    config.update_from_flattened_dict({**RECIPE, **overrides})
    return validate(config)


def test_the_planner_counts_what_crosses_slices():
    s = _settings()
    one, two = plan.plan(s, plan.topology("v5e-64")), plan.plan(s, plan.topology("v5e-64", slices=2))
    assert two.topology.devices == 128 and two.mesh == (2, 64, 1) and two.dcn == (2, 1, 1)
    assert two.rows[0].bytes == one.rows[0].bytes  # data across slices: each slice holds the whole shard of one
    times = {t.name: t for t in plan.step_times(s, two)}
    gradients = times["gradients over DCN"]
    updates = s.learner.mu * -(-s.rollout.rows // s.learner.minibatch_size)
    assert gradients.bound == "DCN" and gradients.seconds == pytest.approx(updates * one.rows[0].bytes / 3.125e9)
    assert "FSDP gathers over DCN" not in times and not any(t.bound == "DCN" for t in plan.step_times(s, one))

    fsdp = plan.plan(_settings(**{"mesh.dcn": "1,2,1"}), plan.topology("v5e-64", slices=2))
    assert fsdp.mesh == (1, 128, 1) and fsdp.rows[0].bytes < one.rows[0].bytes  # the shard over both slices
    names = [t.name for t in plan.step_times(_settings(**{"mesh.dcn": "1,2,1"}), fsdp)]
    assert "FSDP gathers over DCN" in names and "weight sync over DCN" in names and "gradients over DCN" not in names
    shared = _settings(**{"mesh.dcn": "1,2,1", "rl.share_weights": True})  # sampling gathers over DCN every step
    gathers = {t.name: t for t in plan.step_times(shared, plan.plan(shared, plan.topology("v5e-64", slices=2)))}
    per_pass = gathers["FSDP gathers over DCN"].seconds / 14  # 4 updates x 3 + 2 log-prob passes
    assert gathers["rollout gathers over DCN"].seconds == pytest.approx(per_pass * (1024 + 1))  # each decode step
    with pytest.raises(ConfigError, match="needs 2 slices, but 1 are"):
        plan.plan(_settings(**{"mesh.dcn": "2,1,1"}), plan.topology("v5e-64"))


def test_plan_command_prints_dcn_time_on_two_slices():
    """launch/README.md's recipe on 2 x v5e-64 (its trainer flags, the models as their size presets) fits and
    prints the DCN line: data across the slices, once an update, and not what bounds the step."""
    from test_xpk import RECIPE as XPK_RECIPE

    presets = {"--config.models.policy": "llama3-8b", "--config.models.grm": "llama3-8b"}
    flags = [f"{k}={presets[k]}" if k in presets else f"{k}={v}" for k, v in (f.split("=", 1) for f in XPK_RECIPE)
             if not k.startswith("--config.data.")]
    out = subprocess.run([sys.executable, "-m", "rrc_jax.plan", "--config=agr.py", "--topology=v5e-64", "--slices=2",
                          *flags], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 x v5e-64: 128 devices" in out.stdout and "mesh data=2 fsdp=64 tensor=1" in out.stdout
    assert "fits: yes" in out.stdout
    line = next(x for x in out.stdout.splitlines() if x.startswith("DCN over 2 slices"))
    assert "GiB a chip a step" in line and "DCN bounds the step: no" in line
    assert "(once an update)" in next(x for x in out.stdout.splitlines() if x.startswith("gradients over DCN"))


def test_a_70b_policy_that_fits_no_single_v5e_256_is_planned_on_two():
    """Llama-3-70B sampling from its master (`rl.share_weights`) on 512 prompts a step: its rollout cache and
    activations fit no mesh, micro-batch size or remat of one v5e-256; the report names how many slices do (data
    across them: half the rows a slice) and its flags, and those flags plan a step that fits, gradients the only
    bytes over DCN and DCN not what bounds the step."""
    run = {"models.policy": "llama3-70b", "rl.share_weights": True, "rl.prompts_per_step": 512}
    one = plan.report(_settings(**run), "v5e-256").splitlines()
    assert "fits: no" in "\n".join(one) and any(x.startswith("suggestion: nothing fits on v5e-256") for x in one)
    line = next(x for x in one if x.startswith("slices: "))
    assert line.startswith("slices: it fits 2 x v5e-256 with data across slices: --slices=2 --config.mesh.dcn=2,1,1 ")
    flags = dict(f.removeprefix("--config.").split("=") for f in line.split(": ", 2)[2].split(" (")[0].split()
                 if f.startswith("--config."))
    flags = {k: v if k == "mesh.dcn" else json.loads(v.lower()) for k, v in flags.items()}  # as absl's flags read them
    assert flags["mesh.dcn"] == "2,1,1" and flags["mesh.data"] * flags["mesh.fsdp"] * flags["mesh.tensor"] == 256
    two = plan.report(_settings(**run, **flags), "v5e-256", slices=2).splitlines()
    assert "2 x v5e-256: 512 devices" in two[0] and "fits: yes" in "\n".join(two)
    assert [x.split()[0] for x in two if "over DCN" in x.split("  ")[0]] == ["gradients"]
    assert "DCN bounds the step: no" in next(x for x in two if x.startswith("DCN over 2 slices"))


def test_a_70b_policy_that_fits_no_single_v5e_128_is_planned_on_two():
    """Full fine-tuning of Llama-3-70B sampling from its master (`rl.share_weights`): no mesh, micro-batch size or
    remat fits one v5e-128; FSDP across two slices halves every chip's parameters, optimizer state and rows."""
    from rrc_jax.plan.report import _candidates, slices_needed

    s = _settings(**{"models.policy": "llama3-70b", "rl.share_weights": True})
    one = plan.topology("v5e-128")
    assert not any(c.fits for c in _candidates(s, one, [(1, 128 // t, t) for t in (1, 2, 4, 8)]))
    fitting, across = slices_needed(s, one)
    assert (across, fitting.topology.name, fitting.mesh, fitting.dcn) == ("1,2,1", "2 x v5e-128", (1, 64, 4), (1, 2, 1))
    assert fitting.fits and fitting.rows[0].bytes * 2 == pytest.approx(plan.plan(s, one, mesh=(1, 32, 4)).rows[0].bytes,
                                                                       rel=0.01)  # (norms are not sharded)
