"""The main job on a tiny toy world: each reward kind, validation, NaN skipping, anchors, HF export, resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from rrc_jax import train
from rrc_jax.anchors import load_anchors
from rrc_jax.config import base_config, validate
from rrc_jax.models import load_hf

REPO = Path(__file__).resolve().parents[1]

TINY = {
    "steps": 2, "toy.train_prompts": 64, "toy.policy_steps": 20, "toy.grm_steps": 20, "toy.drm_steps": 20,
    "data.eval_prompts": 16, "rl.prompts_per_step": 4, "rl.group_size": 4, "rl.minibatch_size": 8,
    "rl.max_new_tokens": 8, "reward.n_anchors": 2, "reward.judge_max_new_tokens": 20, "eval.every": 2,
    "checkpoint.save_every": 2, "eval.judge_votes": 2,
}


@pytest.fixture(scope="session")
def toy_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("toy_cache")


def tiny_config(kind, workdir, cache, **overrides):
    c = base_config(kind)
    for key, value in {**TINY, "workdir": str(workdir), "toy.cache_dir": str(cache), **overrides}.items():
        node = c
        *path, leaf = key.split(".")
        for p in path:
            node = node[p]
        node[leaf] = value
    return c


def read_metrics(workdir):
    rows = {}
    for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)  # a re-run step overwrites the earlier line
    return rows


def cli_args(workdir, cache, kind="agr", module="rrc_jax.train", **overrides):
    items = {**TINY, "workdir": str(workdir), "toy.cache_dir": str(cache), **overrides}
    return [sys.executable, "-m", module, f"--config={REPO / 'configs' / f'{kind}.py'}"] + [
        f"--config.{k}={v}" for k, v in items.items()]


@pytest.mark.parametrize("kind,extra", [("drm", {}), ("prc", {}), ("scr", {"reward.cara": True}), ("agr", {})])
def test_two_step_run_for_each_reward_kind(kind, extra, tmp_path, toy_cache):
    workdir = train.run(tiny_config(kind, tmp_path / kind, toy_cache, **extra))
    rows = read_metrics(workdir)
    assert sorted(rows) == [0, 1, 2]
    assert 0 <= rows[0]["eval/oracle_quality"] <= 1 and rows[0]["eval/oracle_quality_se"] > 0
    for step in (1, 2):
        for key in ("reward/mean", "reward/std", "loss", "kl", "clip_fraction", "entropy", "response_length",
                    "oracle_quality", "time/rollout", "time/judge", "time/update", "tokens_per_second"):
            assert key in rows[step] and np.isfinite(rows[step][key]), (kind, step, key)
    if kind in ("scr", "agr", "prc"):
        assert rows[1]["judge/questions"] > 0
    if kind == "scr":
        assert "judge/intransitive_triads" in rows[1]
    assert (workdir / "hf_export" / "model.safetensors").is_file()
    assert (workdir / "tensorboard").is_dir()


def test_config_validation_errors():
    for field, value, match in [("reward.kind", "ppo", "reward.kind"), ("rl.group_size", 1, "rl.group_size"),
                                ("rl.minibatch_size", 7, "rl.minibatch_size"), ("reward.ties", "win", "reward.ties"),
                                ("rl.loss_aggregation", "sum", "rl.loss_aggregation")]:
        c = base_config("scr")
        node, leaf = c[field.split(".")[0]], field.split(".")[1]
        node[leaf] = value
        with pytest.raises(ValueError, match=match):
            validate(c)
    c = base_config("agr")
    c.reward.cara = True
    with pytest.raises(ValueError, match="reward.cara"):
        validate(c)


def test_unknown_key_and_missing_model_stop_startup(tmp_path):
    out = subprocess.run(cli_args(tmp_path, tmp_path, **{"reward.bogus": 1}), capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode != 0 and "bogus" in out.stderr
    out = subprocess.run(cli_args(tmp_path / "w", tmp_path, **{"models.grm": str(tmp_path / "nope")}),
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("error: config.models.grm")


def test_nan_update_is_skipped_and_counted(tmp_path, toy_cache, monkeypatch):
    real = train.group_advantages
    calls = []

    def poisoned(r):
        calls.append(1)
        adv = np.asarray(real(r))
        return np.full_like(adv, np.nan) if len(calls) == 2 else adv

    monkeypatch.setattr(train, "group_advantages", poisoned)
    rows = read_metrics(train.run(tiny_config("drm", tmp_path, toy_cache)))
    updates = 4 * 4 // 8
    assert rows[1]["skipped_updates"] == 0
    assert rows[2]["skipped_updates"] == updates and np.isnan(rows[2]["loss"])


def test_anchors_are_stored_and_reused(tmp_path, toy_cache):
    config = tiny_config("agr", tmp_path, toy_cache)
    train.run(config)
    path = tmp_path / "anchors.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 64 and all(len(r["anchors"]) == 2 for r in rows)
    stamp = path.stat().st_mtime_ns
    setup = train.build(config, need_judge=False)
    train.ensure_anchors(setup)
    assert path.stat().st_mtime_ns == stamp
    assert setup.anchors == load_anchors(path, [r["id"] for r in rows], [r["prompt"] for r in rows], 2)
    with pytest.raises(ValueError, match="different prompt"):
        load_anchors(path, [rows[0]["id"]], ["not the prompt"], 2)


def test_anchors_cli_writes_the_file(tmp_path, toy_cache):
    out = subprocess.run(cli_args(tmp_path, toy_cache, module="rrc_jax.anchors", **{"reward.n_anchors": 3}),
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "anchors.jsonl").read_text().splitlines()]
    assert len(rows) == 64 and {len(r["anchors"]) for r in rows} == {3}
    assert len({r["id"] for r in rows}) == 64


def test_hf_export_matches_the_trained_policy(tmp_path, toy_cache):
    from transformers import AutoModelForCausalLM

    from rrc_jax.checkpoint import Checkpointer

    config = tiny_config("drm", tmp_path, toy_cache)
    workdir = train.run(config)
    setup = train.build(config, need_judge=False)
    trained = Checkpointer(workdir / "checkpoints").restore_params(setup.policy)
    assert trained == 2
    ids = jnp.asarray(np.random.default_rng(0).integers(3, setup.policy.cfg.vocab_size, (3, 12)))
    ours = np.asarray(setup.policy(ids))
    exported = AutoModelForCausalLM.from_pretrained(workdir / "hf_export", dtype=torch.float32).eval()
    with torch.no_grad():
        ref = exported(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4)
    np.testing.assert_allclose(np.asarray(load_hf(workdir / "hf_export")(ids)), ours, atol=1e-5)


def test_resume_after_sigkill_gives_identical_metrics(tmp_path, toy_cache):
    """A 6-step run, and a run SIGKILLed after its step-3 checkpoint then restarted with the same command, log the
    same losses and rewards for steps 4-6."""
    overrides = {"steps": 6, "checkpoint.save_every": 3, "eval.every": 3}
    train.build(tiny_config("agr", tmp_path / "warm", toy_cache))  # the toy world exists before timing matters
    straight = tmp_path / "straight"
    subprocess.run(cli_args(straight, toy_cache, **overrides), check=True, capture_output=True, timeout=600,
                   cwd=REPO)
    killed = tmp_path / "killed"
    cmd = cli_args(killed, toy_cache, **overrides)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    deadline = time.time() + 600
    while not (killed / "checkpoints" / "3").is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (killed / "checkpoints" / "3").is_dir()
    subprocess.run(cmd, check=True, capture_output=True, timeout=600, cwd=REPO)
    a, b = read_metrics(straight), read_metrics(killed)
    for step in (4, 5, 6):
        for key in ("loss", "policy_loss", "reward/mean", "reward/std", "oracle_quality"):
            assert a[step][key] == b[step][key], (step, key)


def test_ctrl_c_saves_a_checkpoint_before_exiting(tmp_path, toy_cache):
    train.build(tiny_config("drm", tmp_path / "warm", toy_cache), need_judge=False)  # toy world ready
    workdir = tmp_path / "run"
    cmd = cli_args(workdir, toy_cache, kind="drm", **{"steps": 50, "checkpoint.save_every": 0, "eval.every": 0})
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        metrics = workdir / "metrics.jsonl"
        if metrics.is_file() and any(json.loads(line)["step"] >= 1 for line in metrics.read_text().splitlines()):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err[-2000:]
    saved = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    last = max(json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines())
    assert saved == [last] and 1 <= last < 50
    assert "interrupted: checkpoint of step" in err


def test_prompts_from_a_jsonl_file(tmp_path, toy_cache):
    from rrc_jax.data.toy import SortTask

    rng = np.random.default_rng(0)
    task = SortTask()
    rows = [{"prompt": task.prompt_text(task.prompt(rng))} for _ in range(40)]
    rows += [{"prompt": ""}, {"prompt": [{"role": "user", "content": "1234>"}]}]
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tiny_config("drm", tmp_path / "w", toy_cache, **{"data.path": str(data)})
    metrics = read_metrics(train.run(config))
    assert "reward/mean" in metrics[2] and "oracle_quality" not in metrics[2]  # no oracle for file prompts
    setup = train.build(config, need_judge=False)
    assert len(setup.train.texts) + len(setup.eval.texts) == 41 and "1234>" in setup.train.texts + setup.eval.texts
    config.data.field = "question"
    with pytest.raises(ValueError, match="config.data.field: .* has no field 'question'"):
        train.build(config, need_judge=False)


def test_anchor_refresh_regenerates_from_the_policy(tmp_path, toy_cache):
    """Without refresh the anchors stay those of the reference; with `anchor_refresh_every=1` step 2 replaces them
    with samples of the current policy."""
    fixed = tmp_path / "fixed"
    train.run(tiny_config("agr", fixed, toy_cache))
    refreshed = tmp_path / "refreshed"
    rows = read_metrics(train.run(tiny_config("agr", refreshed, toy_cache, **{"reward.anchor_refresh_every": 1})))
    assert np.isfinite(rows[2]["reward/mean"])
    a = (fixed / "anchors.jsonl").read_text().splitlines()
    b = (refreshed / "anchors.jsonl").read_text().splitlines()
    assert len(a) == len(b) == 64 and a != b


@pytest.mark.parametrize("config_file,kind", [("grm_sft", "grm"), ("drm_bt", "drm")])
def test_train_rm_cli_exports_a_reward_model(tmp_path, config_file, kind):
    cmd = [sys.executable, "-m", "rrc_jax.train_rm", f"--config={REPO / 'configs' / f'{config_file}.py'}",
           f"--config.workdir={tmp_path}", "--config.train.steps=3", "--config.train.batch_size=8",
           "--config.model.hidden=32", "--config.model.layers=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    model = load_hf(tmp_path / "hf_export")
    assert model.cfg.value_head == (kind == "drm")
    bad = subprocess.run(cmd + ["--config.data.path=/data/helpsteer3.jsonl"], capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith("error: config.data.path")
