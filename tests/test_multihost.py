"""Two processes on loopback (4 CPU devices each) train as one 8-device mesh: `jax.distributed` start-up from the
config, one `metrics.jsonl` line per step written by process 0, resume after both are SIGKILLed past a checkpoint,
and the same checkpoint resumed by one process on one device."""

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import jax
import ml_collections
import pytest
from conftest import cli_args, cpu_devices_env

from rrc_jax import distributed
from rrc_jax.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(workdir: Path, cache, n_processes: int, devices: int, **overrides) -> list[subprocess.Popen]:
    env = cpu_devices_env(devices)
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


def test_two_hosts_train_resume_after_sigkill_and_resume_on_one_device(tmp_path, toy_cache):
    # Process 0 builds the toy world if no earlier test has (the other waits at a barrier); the first run makes
    # the anchors (process 0 writes, both hold them), the restarts read them.
    common = {"steps": 3, "checkpoint.save_every": 2, "eval.every": 0, "eval.judge_votes": 0}
    workdir = tmp_path / "run"
    procs = _launch(workdir, toy_cache, 2, 4, **common)
    deadline = time.time() + 600
    while not (workdir / "checkpoints" / "2").is_dir() and all(p.poll() is None for p in procs) and \
            time.time() < deadline:
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    _wait(procs)
    assert (workdir / "checkpoints" / "2").is_dir(), _logs(workdir)[-3000:]
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


def test_partial_distributed_settings_are_a_config_error(monkeypatch):
    """A coordinator without a process count (or an id out of range) is named in one ConfigError; with nothing set
    on a machine that is not a Cloud TPU VM, one process is left alone."""
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    settings = lambda **kw: ml_collections.ConfigDict({"coordinator": "", "num_processes": 0, "process_id": -1, **kw})
    with pytest.raises(ConfigError, match="config.distributed"):
        distributed.initialize(settings(coordinator="127.0.0.1:1234"))
    with pytest.raises(ConfigError, match="process_id=2"):
        distributed.initialize(settings(coordinator="127.0.0.1:1234", num_processes=2, process_id=2))
    distributed.initialize(settings())
    assert not jax.distributed.is_initialized() and jax.process_count() == 1
