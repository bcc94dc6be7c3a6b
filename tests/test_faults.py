"""Faults in the trainer: exact resume after an AGR anchor refresh (after a SIGKILL, and after falling
back from a corrupted latest checkpoint), the drift check without `config.json`, the settings a resume may change,
NaN settings and a judge that abstains on everything, the learner's compiles and its redundant log-prob pass."""

import glob
import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import cli_args, read_metrics, tiny_config
from rrc_jax.config import validate
from rrc_jax.errors import ConfigError
from rrc_jax.rl.trainer import run

REPO = Path(__file__).resolve().parents[1]


def numeric(rows: dict) -> dict:
    """Every numeric field of every step but the wall-clock ones."""
    return {step: {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and not k.startswith("time/") and k != "tokens_per_second"}
            for step, row in rows.items()}


def assert_same_metrics(a: dict, b: dict) -> None:
    a, b = numeric(a), numeric(b)
    assert sorted(a) == sorted(b)
    for step in a:
        assert sorted(a[step]) == sorted(b[step]), step
        differ = {k: (a[step][k], b[step][k]) for k in a[step]
                  if not (a[step][k] == b[step][k] or (math.isnan(a[step][k]) and math.isnan(b[step][k])))}
        assert not differ, (step, differ)


def test_resume_after_an_anchor_refresh_is_exact(tmp_path, toy_cache):
    """Anchors refreshed every 2 steps (before steps 3 and 5), a checkpoint every 3: a run SIGKILLed just
    after writing its third anchors (the step-5 refresh; its latest checkpoint is step 3's, trained against the
    step-3 refresh) resumes to metrics identical to the uninterrupted run's; so does a rerun of the finished run
    whose latest checkpoint (step 6) is corrupted: it falls back to step 3 and replays steps 4-6."""
    overrides = {"steps": 6, "reward.agr.refresh_every": 2, "checkpoint.save_every": 3, "checkpoint.keep": 2,
                 "eval.every": 3, "reward.judge.temperature": 1.0}
    straight = read_metrics(run(validate(tiny_config("agr", tmp_path / "straight", toy_cache, **overrides))))
    killed = tmp_path / "killed"
    cmd = cli_args(killed, toy_cache, **overrides)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    written = 0
    for line in proc.stderr:
        written += "wrote " in line and " anchors to " in line
        if written == 3:
            break
    deadline = time.time() + 600  # the step-3 save is asynchronous: kill once it is committed
    while not (killed / "checkpoints" / "3").is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert written == 3
    assert (killed / "checkpoints" / "3").is_dir() and not (killed / "checkpoints" / "6").exists()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "resumed from the checkpoint of step 3" in out.stderr
    assert_same_metrics(straight, read_metrics(killed))

    victim = max((f for f in glob.glob(f"{killed}/checkpoints/6/state/**/d/*", recursive=True)
                  if os.path.isfile(f)), key=os.path.getsize)
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "set aside the checkpoint of step 6" in out.stderr and "resumed from the checkpoint of step 3" in out.stderr
    assert_same_metrics(straight, read_metrics(killed))


@pytest.fixture(scope="module")
def finished_drm(tmp_path_factory, toy_cache):
    """A finished 2-step DRM run (the cheapest kind), copied by the tests that resume it."""
    return Path(run(validate(tiny_config("drm", tmp_path_factory.mktemp("drm"), toy_cache))))


@pytest.mark.parametrize("damage", ["deleted", "truncated", "a JSON list"])
def test_the_drift_check_reads_the_checkpoint_not_config_json(tmp_path, toy_cache, finished_drm, damage):
    """With `config.json` deleted, truncated or a JSON list, a resume with a changed learning rate is still
    refused (the manifest of the checkpoint records its config), naming the change; the unchanged config resumes."""
    import shutil

    workdir = tmp_path / "w"
    shutil.copytree(finished_drm, workdir)
    saved = workdir / "config.json"
    if damage == "deleted":
        saved.unlink()
    else:
        saved.write_text(saved.read_text()[:100] if damage == "truncated" else "[1, 2]")
    with pytest.raises(ConfigError, match=r"changed: rl.learning_rate: 0.0002 -> 0.1\. "):
        run(validate(tiny_config("drm", workdir, toy_cache, **{"rl.learning_rate": 0.1, "steps": 3})))
    run(validate(tiny_config("drm", workdir, toy_cache)))  # resumes at its last step: nothing to train, no error
    assert json.loads(saved.read_text())["rl"]["learning_rate"] == 2e-4


def test_checkpoints_without_a_recorded_config_need_a_readable_config_json(tmp_path):
    """Older checkpoints (their manifests hold no config): a missing or corrupt `config.json` is one line."""
    from rrc_jax.workdir import _saved_config_file

    for text in (None, "{\"rl\": ", "[1]"):
        path = tmp_path / "config.json"
        path.unlink(missing_ok=True)
        if text is not None:
            path.write_text(text)
        with pytest.raises(ConfigError, match="config.json is unreadable .*cannot be checked") as e:
            _saved_config_file(path)
        assert "\n" not in str(e.value)


def test_steps_may_change_on_resume_only_under_a_constant_schedule():
    """The length of a run sets a cosine schedule's curve, so a changed `steps` is drift there."""
    from rrc_jax.config import base_config, config_record
    from rrc_jax.workdir import config_changes, config_hash

    constant, cosine = base_config("agr"), base_config("agr")
    cosine.rl.lr_schedule = "cosine"
    for c in (constant, cosine):
        longer = c.copy_and_resolve_references()
        longer.steps = 80
        changes = config_changes(config_record(c), config_record(longer))
        assert changes == ([] if c is constant else ["steps: 40 -> 80"])
        assert (config_hash(config_record(c)) == config_hash(config_record(longer))) == (c is constant)
    judge = constant.copy_and_resolve_references()
    judge.reward.judge.max_batch = 64  # the judge's random draws follow its chunks: not a free change
    assert config_changes(config_record(constant), config_record(judge)) == ["reward.judge.max_batch: 256 -> 64"]


def test_a_moved_reward_service_may_change_on_resume(tmp_path):
    """A served reward's `reward.service_url` changed from one address to another passes the resume check (the
    service moved, as `inference.url` may); set or cleared, it moves the judge into or out of the trainer and is
    refused, as other changes are."""
    from etils import epath

    from rrc_jax.config import base_config, config_record
    from rrc_jax.workdir import ResumeConfig, check_resume

    (tmp_path / "checkpoints" / "3").mkdir(parents=True)  # (written without a manifest: config.json is compared)
    config = base_config("agr")
    config.reward.service_url = "http://10.0.0.2:8000"
    (tmp_path / "config.json").write_text(json.dumps(config_record(config)))
    config.reward.service_url = "http://10.0.0.3:8000"
    check_resume(config_record(config), epath.Path(tmp_path), ResumeConfig())
    config.reward.service_url = ""
    with pytest.raises(ConfigError, match=r"changed: reward.service_url: 'http://10.0.0.2:8000' -> ''\. "):
        check_resume(config_record(config), epath.Path(tmp_path), ResumeConfig())
    config.reward.service_url, config.rl.learning_rate = "http://10.0.0.3:8000", 0.1
    with pytest.raises(ConfigError, match=r"changed: rl.learning_rate: 0.0002 -> 0.1\. "):
        check_resume(config_record(config), epath.Path(tmp_path), ResumeConfig())


def test_every_setting_a_resume_may_change_leaves_the_run_as_it_was(tmp_path, toy_cache):
    """3 steps straight, and 2 steps resumed for a third with every field of `RESUMABLE_CHANGES` that one
    device can change set otherwise (the length, micro-batches, remat, log-prob chunks, the guard, checkpointing,
    logging, evaluation, the toy cache's path, the mesh spelled out, the judge server's address and requests in
    flight): the training metrics of every step agree."""
    import shutil

    common = {"reward.judge.temperature": 1.0, "eval.every": 0}
    straight = read_metrics(run(validate(tiny_config("agr", tmp_path / "straight", toy_cache, steps=3, **common))))
    resumed = tmp_path / "resumed"
    run(validate(tiny_config("agr", resumed, toy_cache, steps=2, **common)))
    cache2 = tmp_path / "cache2"
    shutil.copytree(toy_cache, cache2, ignore=shutil.ignore_patterns("*.lock"))
    changed = {"steps": 3, "rl.micro_batch_size": 4, "rl.remat": True, "rl.logprob_chunk": 3,
               "rl.max_skipped_fraction": 0.9, "rl.guard_window": 3, "rl.max_param_growth": 100.0,
               "checkpoint.save_every": 1, "checkpoint.keep": 3, "log.samples_every": 1, "log.tensorboard": False,
               "eval.judge_votes": 0, "reward.drm.max_batch": 8, "mesh.fsdp": 1,
               "inference.url": "http://127.0.0.1:9", "inference.concurrency": 4}  # (the jax engine reads neither)
    rows = read_metrics(run(validate(tiny_config("agr", resumed, cache2, **{**common, **changed}))))
    train = lambda r: {s: {k: v for k, v in row.items() if not k.startswith("eval/")} for s, row in r.items()}
    a, b = numeric(train(straight)), numeric(train(rows))
    for step in (1, 2, 3):
        for k in a[step]:
            assert b[step][k] == pytest.approx(a[step][k], rel=1e-4, abs=1e-6, nan_ok=True), (step, k)


def test_nan_settings_are_refused_at_start_up(tmp_path, toy_cache):
    """Every float field (`rl.beta`, `rl.eps_high`, ...) is checked finite; a NaN judge
    temperature used to pass `temperature < 0` and give 100% abstentions and exit 0."""
    from rrc_jax.config import base_config, validate

    for field in ("reward.judge.temperature", "rl.beta", "rl.eps_high", "rl.learning_rate", "reward.agr.alpha",
                  "toy.noise", "log.abstain_abort"):
        for bad in (math.nan, math.inf):
            config = base_config("agr")
            config.update_from_flattened_dict({field: bad})
            with pytest.raises(ConfigError, match=rf"config\.{field}: {bad} is not a finite number"):
                validate(config)
    out = subprocess.run(cli_args(tmp_path, toy_cache, **{"reward.judge.temperature": "nan"}), capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == ["error: config.reward.judge.temperature: nan is not a finite number"]


def test_a_judge_that_abstains_on_everything_stops_the_run_by_default(tmp_path, toy_cache, monkeypatch):
    """With the default `log.abstain_abort`, three steps of a judge without verdicts stop the run
    (`Diverged`: exit status 3 on the command line) before it saves or exports anything past them."""
    from rrc_jax.config import base_config
    from rrc_jax.errors import Diverged
    from rrc_jax.judge import judge as judge_lib

    assert base_config("agr").log.abstain_abort == 0.9
    monkeypatch.setattr(judge_lib, "parse_verdict", lambda text: None)
    with pytest.raises(Diverged, match=r"step 3: the judge abstained on more than log.abstain_abort=0.9 of its "
                                       r"questions for 3 steps in a row"):
        run(validate(tiny_config("scr", tmp_path, toy_cache, steps=4, **{"log.abstain_abort": 0.9})))
    assert not (tmp_path / "hf_export").exists()


def test_the_old_logprob_pass_runs_only_when_a_rollout_gets_several_updates(tmp_path, toy_cache, monkeypatch):
    """One minibatch per step and `rl.mu=1` (each rollout's one update is on-policy) run no log-prob pass
    of the policy; two minibatches (the second is off-policy) run one per step."""
    from rrc_jax.rl import trainer as trainer_lib

    calls = []
    real = trainer_lib.token_logprobs
    monkeypatch.setattr(trainer_lib, "token_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    run(validate(tiny_config("drm", tmp_path / "one", toy_cache, steps=1, **{"rl.minibatch_size": 16})))
    assert calls == []
    run(validate(tiny_config("drm", tmp_path / "two", toy_cache, steps=1, **{"rl.minibatch_size": 8})))
    assert calls == [1]


def test_a_workdir_that_is_a_file_or_unwritable_and_a_mistyped_init_from_are_one_line(tmp_path, toy_cache):
    """Tracebacks before; a mistyped `init_from` also created the directory it named."""
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ConfigError, match=f"config.workdir: {afile} is a file, not a directory"):
        run(validate(tiny_config("drm", afile, toy_cache)))
    with pytest.raises(ConfigError, match="config.workdir: /sys/rrc_jax_test cannot be written"):
        run(validate(tiny_config("drm", "/sys/rrc_jax_test", toy_cache)))
    typo = tmp_path / "no_such_run" / "checkpoints"
    with pytest.raises(ConfigError, match=f"config.init_from: {typo} is not a directory"):
        run(validate(tiny_config("drm", tmp_path / "w", toy_cache, init_from=str(typo))))
    assert not typo.parent.exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs (root only; skipped where mounting is not allowed), unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if out.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_during_a_save_is_one_line_and_nothing_past_the_last_checkpoint_is_logged(small_disk, toy_cache):
    """A checkpoint every step on a 2 MB disk (one checkpoint fits): one `error:` line naming the disk and
    the step it resumes from, no traceback (Orbax logged one per thread), no line of a step past the last checkpoint
    on disk; with room again, the same command resumes and finishes with every step logged once."""
    workdir = small_disk / "w"
    cmd = cli_args(workdir, toy_cache, kind="drm", steps=4, **{"checkpoint.save_every": 1, "log.tensorboard": False,
                                                                "log.samples_every": 0})
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    last = [line for line in out.stderr.splitlines() if line.strip()][-1]
    assert last.startswith(f"error: the checkpoint of step 2 could not be written to {workdir / 'checkpoints'}: no "
                           "space left on device (the disk is full"), last
    assert last.endswith("free space there (or fix its permissions) and rerun: the run resumes from the checkpoint "
                         "of step 1")
    assert [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    subprocess.run(["mount", "-o", "remount,size=40m", str(small_disk)], check=True)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2,
                                                                                                           3, 4]


def test_train_rm_reports_no_held_out_accuracy_from_nothing(tmp_path, monkeypatch, capsys):
    """No result from nothing, in train_rm: a held-out evaluation whose every vote abstained gives no accuracy (it printed
    0.5), says why, and writes `accuracy: null`."""
    from rrc_jax.config import rm_config, validate_rm
    from rrc_jax.rm import recipes

    config = rm_config("grm")
    config.workdir = str(tmp_path)
    config = validate_rm(config)
    nothing = {"accuracy": 0.5, "examples": 4, "votes": 1, "abstain_rate": 1.0}
    monkeypatch.setattr(recipes, "held_out_accuracy", lambda *args: (dict(nothing), []))
    metrics = recipes.held_out_metrics(config, None, None, [])
    assert math.isnan(metrics["eval/accuracy"]) and json.loads((tmp_path / "eval.json").read_text())["accuracy"] is None
    assert "warning: held out: no accuracy (all 8 judge votes abstained) on 4 pairs" in capsys.readouterr().err


def test_a_truncated_anchors_file_is_one_line_naming_its_line(tmp_path):
    """A truncated anchors file (a torn last line) was a JSON traceback."""
    from rrc_jax.rl.anchor_store import load_anchors, save_anchors

    path = tmp_path / "anchors.jsonl"
    save_anchors(path, [0, 1], ["12>", "21>"], [["12", "21"], ["12", "12"]])
    assert load_anchors(path, [0, 1], ["12>", "21>"], 2) == [["12", "21"], ["12", "12"]]
    path.write_text(path.read_text()[:-15])
    with pytest.raises(ConfigError, match=rf"{path}:2: not an anchors row .*truncated\?\): delete it to regenerate"):
        load_anchors(path, [0, 1], ["12>", "21>"], 2)
