"""Steps per minute of the synchronous and the asynchronous step (`rl.max_staleness`) on the toy world, the judge
served in a second process (`python -m rrc_jax.serve` on the loopback).

    python benchmarks/async_step.py --kind=agr --steps=14 --seeds=0,1 --ks=0,1

The server is pinned to the first core and the trainer to the second (`taskset`, where there is one) so that the
judge and the policy each have a core, as a judge on its own chips does. A first run (`--warm_steps`, not counted)
lets the server compile its programs. For each seed and k the trainer then runs `--config=KIND.py` with
`inference.engine=openai` against the server (`eval.every=0`, `eval.judge_votes=0`: only the training steps and the
last step's evaluation, which does not ask the judge), timed over steps 2 .. N - 1 by when each step's metrics line
appears (step 1's compiles and the last step's evaluation are out). Prints one row per run, then each k's mean rate
against k = 0's, two ways: `steps_per_min` over the whole span, and `median_steps_per_min` from the median step,
which a step where the server compiled a new shape (tens of seconds on one core, when new response lengths give
the judge's questions a shape it has not run) does not move. A row also has the median and longest seconds the
judge took for a step's batch (`time/reward`), the policy's median (rollout + update), the mean oracle quality of
the rollouts and the last evaluation's, and the median share of a step the server's core was busy (its CPU seconds
from /proc, read as each step's metrics line appears; Linux); at k = 0 the bounds on any overlap: the phases',
(policy + judge) / max(policy, judge), and the server's, 1 / busy share (its core at work all of every step); at
k >= 1 the learner's median wait for rewards and the staleness.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from statistics import median

from absl import flags

from rrc_jax import cli


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pinned(cmd: list[str], core: int | None) -> list[str]:
    return ["taskset", "-c", str(core), *cmd] if core is not None and shutil.which("taskset") else cmd


def toy_grm(cache: Path) -> str:
    """The toy world's judge directory (built into `cache` on first use)."""
    from rrc_jax.config import base_config, validate
    from rrc_jax.rl.roles import Roles

    config = base_config("agr")
    config.toy.cache_dir = str(cache)
    return str(Roles.of_run(validate(config)).path("grm"))


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the judge server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the judge server at {url} did not answer within {timeout:.0f} s")


def cpu_seconds(pid: int) -> float | None:
    """The user + system CPU seconds process `pid` has run so far (Linux's /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_run(cmd: list[str], metrics: Path, server: int) -> tuple[dict[int, float], dict[int, float | None]]:
    """When each step's metrics line appeared (`time.perf_counter()`, polled every 20 ms), and the CPU seconds the
    judge's server (process `server`) had run by then, by step."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen_at: dict[int, float] = {}
    server_cpu: dict[int, float | None] = {}
    while proc.poll() is None:
        if metrics.exists():
            for line in metrics.read_text().splitlines():
                step = json.loads(line)["step"] if line.strip() else None
                if step is not None and step not in seen_at:
                    seen_at[step], server_cpu[step] = time.perf_counter(), cpu_seconds(server)
        time.sleep(0.02)
    err = proc.stderr.read()
    if proc.returncode:
        raise SystemExit(f"the trainer failed ({proc.returncode}):\n{err[-3000:]}")
    return seen_at, server_cpu


def summary(seen_at: dict[int, float], lines: list[dict], seed: int, k: int, steps: int,
            server_cpu: dict[int, float | None] | None = None) -> dict:
    """One run's row: its rates over steps 2 .. steps - 1, its quality, the phases' seconds a step and, with the
    server's CPU seconds at each step (`server_cpu`), the median share of a step its core was busy."""
    seconds = seen_at[steps - 1] - seen_at[1]
    intervals = [seen_at[t] - seen_at[t - 1] for t in range(2, steps)]
    steady = [x for x in lines if 2 <= x["step"] <= steps - 1]
    quality = [x["oracle_quality"] for x in lines if "oracle_quality" in x]
    final = next(x["eval/oracle_quality"] for x in reversed(lines) if "eval/oracle_quality" in x)
    policy = median([x["time/rollout"] + x["time/update"] for x in steady])
    judged = [x["time/reward"] for x in steady]  # each batch's judging, at any k
    judge, step = median(judged), median(intervals)
    row = {"seed": seed, "k": k, "seconds": round(seconds, 2), "steps_per_min": round(60 * (steps - 2) / seconds, 2),
           "median_step_s": round(step, 3), "median_steps_per_min": round(60 / step, 2),
           "longest_step_s": round(max(intervals), 3), "policy_median_s": round(policy, 3),
           "judge_median_s": round(judge, 3), "judge_max_s": round(max(judged), 3),
           "train_quality": round(sum(quality) / len(quality), 4), "final_eval_quality": round(final, 4)}
    busy = [(server_cpu[t] - server_cpu[t - 1]) / (seen_at[t] - seen_at[t - 1]) for t in range(2, steps)
            if server_cpu and server_cpu.get(t) is not None and server_cpu.get(t - 1) is not None]
    if busy:
        row["server_busy_median"] = round(median(busy), 3)
    if k == 0:
        row["overlap_bound"] = round((policy + judge) / max(policy, judge), 3)
        if busy:  # the server's core at work all of every step: the most an overlap can gain
            row["busy_bound"] = round(1 / max(median(busy), 1e-9), 3)
    else:
        row.update(learner_wait_median_s=round(median([x["time/learner_wait"] for x in steady]), 3),
                   staleness=sum(x["staleness/mean"] for x in steady) / len(steady))
    return row


def run() -> None:
    args = flags.FLAGS
    cache = Path(args.cache)
    grm, port = toy_grm(cache), free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(pinned([sys.executable, "-m", "rrc_jax.serve", f"--model={grm}", f"--port={port}",
                                      "--served_name=toy-grm"], 0), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    rows = []

    def command(workdir: Path, steps: int, seed: int, k: int) -> list[str]:
        return pinned([sys.executable, "-m", "rrc_jax.train", f"--config={args.kind}.py",
                       f"--config.workdir={workdir}", f"--config.toy.cache_dir={cache}", f"--config.steps={steps}",
                       f"--config.seed={seed}", f"--config.rl.max_staleness={k}", "--config.inference.engine=openai",
                       f"--config.inference.url={url}", "--config.eval.every=0", "--config.eval.judge_votes=0",
                       "--config.checkpoint.save_every=0", *[f"--config.{s}" for s in args.set or []]], 1)

    try:
        wait_healthy(url, server)
        warm = Path(tempfile.mkdtemp(prefix="async_warm_"))
        timed_run(command(warm, args.warm_steps, 0, 0), warm / "metrics.jsonl", server.pid)
        shutil.rmtree(warm, ignore_errors=True)
        for seed in [int(s) for s in args.seeds.split(",")]:
            for k in [int(k) for k in args.ks.split(",")]:
                workdir = Path(tempfile.mkdtemp(prefix=f"async_{args.kind}_k{k}_s{seed}_"))
                seen_at, server_cpu = timed_run(command(workdir, args.steps, seed, k), workdir / "metrics.jsonl",
                                                server.pid)
                lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
                row = summary(seen_at, lines, seed, k, args.steps, server_cpu)
                rows.append(row)
                print(json.dumps(row), flush=True)
                shutil.rmtree(workdir, ignore_errors=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    for key in ("steps_per_min", "median_steps_per_min"):
        base = [r[key] for r in rows if r["k"] == 0]
        for k in sorted({r["k"] for r in rows}):
            rates = [r[key] for r in rows if r["k"] == k]
            ratio = f", {sum(rates) / len(rates) / (sum(base) / len(base)):.2f}x k=0" if base else ""
            print(f"k={k}: {key} {sum(rates) / len(rates):.2f} over {len(rates)} runs{ratio}")


def define_flags() -> None:
    flags.DEFINE_string("kind", "agr", "the recipe (--config=KIND.py)")
    flags.DEFINE_integer("steps", 8, "steps a run (the clock runs over steps 2 .. steps - 1)")
    flags.DEFINE_integer("warm_steps", 2, "steps of the first run, not counted (the server compiles its shapes)")
    flags.DEFINE_string("seeds", "0,1", "comma-separated seeds")
    flags.DEFINE_string("ks", "0,1", "comma-separated rl.max_staleness values")
    flags.DEFINE_string("cache", os.path.join(tempfile.gettempdir(), "rrc_toy_cache"), "the toy world's cache")
    flags.DEFINE_multi_string("set", [], "another KEY=VALUE of every run's config (--config.KEY=VALUE)")


if __name__ == "__main__":
    define_flags()
    cli.start(cli.flags_main(run))
