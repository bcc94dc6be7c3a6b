"""Two processes on loopback (4 CPU devices each) train as one 8-device mesh: `jax.distributed` start-up from the
config, one `metrics.jsonl` line per step written by process 0, resume after both are SIGKILLed past a checkpoint,
and the same checkpoint resumed by one process on one device; each host samples, judges and scores only its own
rows, and together they get the single-process results."""

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import ml_collections
import numpy as np
import pytest
import multihost_engine
from conftest import cli_args, cpu_devices_env

from rrc_jax import distributed
from rrc_jax.config import parse
from rrc_jax.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(workdir: Path, cache, n_processes: int, devices: int, env: dict | None = None,
            **overrides) -> list[subprocess.Popen]:
    env = {**cpu_devices_env(devices), **(env or {})}
    port = _free_port()
    procs = []
    for i in range(n_processes):
        dist = {"distributed.coordinator": f"127.0.0.1:{port}", "distributed.num_processes": n_processes,
                "distributed.process_id": i} if n_processes > 1 else {}
        log = open(workdir.parent / f"{workdir.name}.{len(list(workdir.parent.glob(workdir.name + '.*')))}.log", "w")
        procs.append(subprocess.Popen(cli_args(workdir, cache, **{**overrides, **dist}), env=env, cwd=REPO,
                                      stdout=log, stderr=subprocess.STDOUT))
    return procs


def _wait(procs, timeout=600) -> list[int]:
    return [p.wait(timeout=timeout) for p in procs]


def _logs(workdir: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(workdir.parent.glob(workdir.name + ".*.log")))


def _steps(workdir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _kill_past_checkpoint(procs, workdir: Path, step: int) -> None:
    """SIGKILL every process of a run on `workdir` once its step-`step` checkpoint is committed."""
    deadline = time.time() + 600
    while not (workdir / "checkpoints" / str(step)).is_dir() and all(p.poll() is None for p in procs) and \
            time.time() < deadline:
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    _wait(procs)
    assert (workdir / "checkpoints" / str(step)).is_dir(), _logs(workdir)[-3000:]


def test_two_hosts_train_resume_after_sigkill_and_resume_on_one_device(tmp_path, toy_cache):
    # Process 0 builds the toy world if no earlier test has (the other waits at a barrier); the first run makes
    # the anchors (process 0 writes, both hold them), the restarts read them.
    common = {"steps": 3, "checkpoint.save_every": 2, "eval.every": 0, "eval.judge_votes": 0}
    workdir = tmp_path / "run"
    _kill_past_checkpoint(_launch(workdir, toy_cache, 2, 4, **common), workdir, 2)
    assert not (workdir / "checkpoints" / "3").exists(), "killed too late: the run had finished"

    codes = _wait(_launch(workdir, toy_cache, 2, 4, **common))
    logs = _logs(workdir)
    assert codes == [0, 0], logs[-3000:]
    assert "resumed from the checkpoint of step 2" in logs
    assert _steps(workdir) == [0, 1, 2, 3]  # process 0 alone writes; the killed run's later lines are dropped
    first = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[0])
    assert (first["system/processes"], first["system/devices"]) == (2, 8)  # one program over both hosts

    one = _wait(_launch(workdir, toy_cache, 1, 1, **{**common, "steps": 4}))
    assert one == [0], _logs(workdir)[-3000:]
    assert "resumed from the checkpoint of step 3" in _logs(workdir)
    assert _steps(workdir) == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_two_hosts_one_step_stale_resume_after_sigkill_mid_update_to_the_uninterrupted_metrics(tmp_path, toy_cache):
    """`rl.max_staleness=1` on two hosts (the reward on the trainer's thread, in the pipeline's order): both killed
    during step 4's update, rerun, give every step's metrics of an uninterrupted two-host run; the step-2 checkpoint
    held batch 3 in flight, each host's own rows."""
    from test_faults import assert_same_metrics

    from conftest import read_metrics
    from rrc_jax.fault_points import ENV

    common = {"steps": 5, "rl.max_staleness": 1, "checkpoint.save_every": 2, "eval.every": 2, "eval.judge_votes": 0}
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert _wait(_launch(straight, toy_cache, 2, 4, **common)) == [0, 0], _logs(straight)[-3000:]
    codes = _wait(_launch(killed, toy_cache, 2, 4, env={ENV: "update:4"}, **common))
    assert codes[0] == -signal.SIGKILL and codes[1] != 0, _logs(killed)[-3000:]
    assert _wait(_launch(killed, toy_cache, 2, 4, **common)) == [0, 0], _logs(killed)[-3000:]
    assert "resumed from the checkpoint of step 2" in _logs(killed)
    assert "the reward runs on the trainer's thread" in _logs(killed)
    assert_same_metrics(read_metrics(straight), read_metrics(killed))


def test_each_host_samples_and_judges_only_its_own_rows(tmp_path):
    """Two hosts pass the engine, the judge's tournaments and the DRM only their own prompts and questions (host 1
    fewer, and no groups to rank at all): together they get exactly the single-process results of the whole
    workload on one device (`multihost_engine.py`), and the host helpers gather texts and reduce metrics across hosts."""
    script = str(REPO / "tests" / "multihost_engine.py")
    port = _free_port()
    hosts = [subprocess.Popen([sys.executable, script, str(tmp_path / "two"), f"127.0.0.1:{port}", "2", str(i)],
                              env=cpu_devices_env(4), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(2)]
    multihost_engine.main(str(tmp_path / "one"))  # the reference, here on one device, while the hosts run
    logs = [h.communicate(timeout=600)[0] for h in hosts]
    assert [h.returncode for h in hosts] == [0, 0], (logs[0] + logs[1])[-3000:]
    whole = json.loads((tmp_path / "one.0.json").read_text())
    parts = [json.loads((tmp_path / f"two.{i}.json").read_text()) for i in range(2)]
    for key in ("generate", "complete_True", "complete_False", "merge_sort", "knockout"):
        assert parts[0][key] + parts[1][key] == whole[key], key
    for key in ("complete_True_logprobs", "complete_False_logprobs", "next_token", "drm"):
        np.testing.assert_allclose(np.array(parts[0][key] + parts[1][key]), np.array(whole[key]), atol=1e-4)
    assert parts[1]["merge_sort"] == [] and len(parts[1]["generate"]) == 2  # 1 prompt x 2
    for part in parts:
        assert part["gathered"] == ["host 0: 6", "host 1: 3"]
        assert part["metrics"] == {"judge/questions": whole["metrics"]["judge/questions"], "reward/mean": 4.5}


def test_partial_distributed_settings_are_a_config_error(monkeypatch):
    """Some but not all of coordinator, process count and id (in the config, or else in the environment) are named
    in one line; with nothing set on a machine that is not a Cloud TPU VM, one process is left alone."""
    for name in distributed.ENVIRONMENT.values():
        monkeypatch.delenv(name, raising=False)
    DistributedConfig = distributed.DistributedConfig
    for given, named in (({"coordinator": "127.0.0.1:1234"}, r"config.distributed.num_processes: 0 must be >= 1"),
                         ({"coordinator": "127.0.0.1:1234", "num_processes": 2, "process_id": 2},
                          r"config.distributed.process_id: 2 must be in \[0, num_processes=2\)"),
                         ({"process_id": 0}, r"config.distributed.coordinator: empty")):
        with pytest.raises(ConfigError, match=named) as e:
            DistributedConfig(**given)
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="config.distributed.num_processes"):  # parsed at the edge, as train does
        config = ml_collections.ConfigDict({"distributed": {"coordinator": "127.0.0.1:1234", "num_processes": 0,
                                                            "process_id": -1}})
        distributed.initialize(parse(DistributedConfig, config))
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1234")
    with pytest.raises(ConfigError, match="JAX_NUM_PROCESSES: 0 must be >= 1"):
        distributed.initialize(DistributedConfig())
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS")
    distributed.initialize(DistributedConfig())
    distributed.initialize()
    assert not jax.distributed.is_initialized() and jax.process_count() == 1
