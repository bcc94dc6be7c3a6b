"""metrics.jsonl rows (strict JSON, resume), TensorBoard event files read back by the real `tensorboard` reader, and
the optional W&B run (missing package, and a fake `wandb` module)."""

import json
import sys
import types

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rrc_jax.errors import ConfigError
from rrc_jax.metrics import MetricsLogger


def strict_rows(workdir):
    """The rows of `metrics.jsonl`, parsed with NaN / Infinity refused."""

    def refuse(constant):
        raise ValueError(f"bare {constant} in metrics.jsonl")

    return [json.loads(line, parse_constant=refuse) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def tensorboard_scalars(workdir):
    """`{tag: [(step, value), ...]}` as TensorBoard shows them (purge events honoured)."""
    accumulator = EventAccumulator(str(workdir / "tensorboard"))
    accumulator.Reload()
    return {tag: [(e.step, round(e.value, 5)) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def test_jsonl_is_strict_json_with_null_for_non_finite_values(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    log.log(0, {"reward/mean": 0.5, "eval/oracle_quality": np.float32(0.25)})
    log.log(3, {"reward/mean": float("nan"), "kl": float("inf"), "name": "not a scalar",
                "per_group": np.array([1.0, np.nan, -np.inf]), "loss": np.float32("nan")})
    log.close()
    rows = strict_rows(tmp_path)
    assert rows[0] == {"step": 0, "reward/mean": 0.5, "eval/oracle_quality": 0.25}
    assert rows[1] == {"step": 3, "reward/mean": None, "kl": None, "name": "not a scalar",
                       "per_group": [1.0, None, None], "loss": None}


def test_tensorboard_reads_the_scalars_and_skips_non_finite_ones(tmp_path):
    log = MetricsLogger(tmp_path)
    for step in range(3):
        log.log(step, {"kl": step / 10, "reward/mean": float("nan") if step == 1 else 1.0 + step, "name": "x"})
    log.close()
    assert tensorboard_scalars(tmp_path) == {"kl": [(0, 0.0), (1, 0.1), (2, 0.2)],
                                             "reward/mean": [(0, 1.0), (2, 3.0)]}


def test_a_resumed_run_drops_the_lines_and_events_logged_after_its_checkpoint(tmp_path):
    """Steps 1-4 logged, then the run resumes from the checkpoint of step 2 and logs 3-5 again: every step has one
    line and one TensorBoard point, the new ones after 2; a run with no checkpoint yet (resume_step 0) starts over."""
    log = MetricsLogger(tmp_path)
    for step in range(1, 5):
        log.log(step, {"loss": float(step)})
    log.close()
    log = MetricsLogger(tmp_path, resume_step=2)
    assert [row["step"] for row in strict_rows(tmp_path)] == [1, 2]
    for step in range(3, 6):
        log.log(step, {"loss": 10.0 * step})
    log.close()
    assert [(row["step"], row["loss"]) for row in strict_rows(tmp_path)] == [(1, 1), (2, 2), (3, 30), (4, 40),
                                                                             (5, 50)]
    assert tensorboard_scalars(tmp_path) == {"loss": [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]}
    MetricsLogger(tmp_path, resume_step=0).close()
    assert strict_rows(tmp_path) == []
    assert tensorboard_scalars(tmp_path) == {"loss": []}  # the tag is known, all its points purged


def test_wandb_without_the_package_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails, installed or not
    with pytest.raises(ConfigError, match=r"log.wandb=True needs the wandb package: pip install wandb"):
        MetricsLogger(tmp_path, wandb=True)


def test_wandb_run_gets_the_scalars(tmp_path, monkeypatch):
    calls = []

    class Run:
        def log(self, metrics, *, step):
            calls.append(("log", step, metrics))

        def finish(self):
            calls.append(("finish",))

    def init(**kwargs):
        calls.append(("init", kwargs))
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    log = MetricsLogger(tmp_path, tensorboard=False, wandb=True, wandb_project="p", record={"lr": 1e-6}, name="run")
    log.log(1, {"loss": 0.5, "kl": float("nan"), "name": "x"})
    log.close()
    assert calls == [("init", {"project": "p", "config": {"lr": 1e-6}, "name": "run", "dir": str(tmp_path),
                               "resume": "allow"}),
                     ("log", 1, {"loss": 0.5}), ("finish",)]
