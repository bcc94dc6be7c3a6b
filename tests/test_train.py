"""The main job on the tests' toy world: each reward kind, validation, NaN skipping, anchors, HF export, resume,
the command line (packaged configs from any directory, plug-in rewards, one-line user errors)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from conftest import cli_args, read_metrics, tiny_config
from rrc_jax.config import base_config, validate
from rrc_jax.errors import ConfigError
from rrc_jax.models import load_hf
from rrc_jax.rl import trainer as trainer_lib
from rrc_jax.rl.anchor_store import load_anchors
from rrc_jax.rl.rollout import sample_groups
from rrc_jax.rl.trainer import Trainer, run

REPO = Path(__file__).resolve().parents[1]
EXTRA = {"drm": {}, "prc": {}, "scr": {"reward.scr.cara": True}, "agr": {"rl.beta": 1e-3, "reward.judge.temperature": 1.0},  # the defaults
         # RM-R1's RLVR: the toy GRM trained as the policy on the toy task's preference questions
         "rlvr": {"models.policy": "toy:grm", "data.format": "pairs", "eval.judge_votes": 0, "rl.max_new_tokens": 20},
         # IRPO: the toy pointwise judge trained on pairs of pointwise questions; then its scores as rewards
         "irpo": {"models.policy": "toy:pointwise", "data.format": "pairs", "reward.judge.template": "toy_pointwise",
                  "eval.judge_votes": 0, "rl.max_new_tokens": 20},
         "pointwise": {"models.grm": "toy:pointwise", "reward.judge.template": "toy_pointwise",
                       "eval.judge_votes": 0},
         # a tournament (the others differ only in their rules: test_tournament_rules), seeded by the DRM
         "seeded_knockout": {"eval.judge_votes": 0},
         # an adaptive schedule with AGR's anchors, under its own config group (test_adaptive: its rules)
         "agr_sequential": {"eval.judge_votes": 0, "reward.agr_sequential.n_anchors": 3}}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, toy_cache):
    """`finished(kind)`: the workdir of a finished default tiny run of `kind`, run once per module and shared by the
    tests that only read what a run left (they must not write into it)."""
    done = {}

    def get(kind):
        if kind not in done:
            done[kind] = Path(run(validate(tiny_config(kind, tmp_path_factory.mktemp(kind), toy_cache, **EXTRA[kind]))))
        return done[kind]

    return get


@pytest.mark.parametrize("kind", sorted(EXTRA))
def test_two_step_run_for_each_reward_kind(kind, finished):
    workdir = finished(kind)
    rows = read_metrics(workdir)
    assert sorted(rows) == [0, 1, 2]
    assert 0 <= rows[0]["eval/oracle_quality"] <= 1 and rows[0]["eval/oracle_quality_se"] >= 0
    assert all(isinstance(rows[s]["time/compile_programs"], int) and rows[s]["time/compile_programs"] >= 0
               for s in rows)  # (programs another test compiled in this process are not compiled again)
    if kind not in ("rlvr", "irpo"):  # (20 tokens are too few for the toy judges' reasoning: every pair may be wrong)
        assert rows[0]["eval/oracle_quality_se"] > 0
    for step in (1, 2):
        for key in ("reward/mean", "reward/std", "loss", "kl", "clip_fraction", "entropy", "response_length",
                    "oracle_quality", "time/rollout", "time/reward", "time/update", "tokens_per_second",
                    "time/compile", "time/compile_programs"):
            if key == "oracle_quality" and kind == "irpo":
                continue  # a score alone is neither right nor wrong: the pairs' accuracy is reward/pair_accuracy
            assert key in rows[step] and np.isfinite(rows[step][key]), (kind, step, key)
    if kind in ("scr", "agr", "prc"):
        assert rows[1]["judge/questions"] > 0 and "eval/win_rate_vs_reference" in rows[2]
    if kind == "pointwise":  # every response scored `votes` times
        assert rows[1]["judge/questions"] == 4 * 4 * 2 and "eval/win_rate_vs_reference" not in rows[2]
    if kind == "irpo":
        assert {"reward/pair_accuracy", "reward/score_std", "reward/format_ok"} <= set(rows[1])
    if kind == "scr":
        assert "judge/intransitive_triads" in rows[1]
    if kind == "seeded_knockout":  # m - 1 duels of 2 votes for each of 4 prompts
        assert rows[1]["judge/comparisons"] == 3 and rows[1]["judge/questions"] == 4 * 3 * 2
    if kind == "agr_sequential":  # each response meets 2 of its 3 anchors, then 1 more unless its tolerance stops it
        assert 2 <= rows[1]["judge/comparisons"] <= 4 * 3 and 0 <= rows[1]["judge/tolerance_stops"] <= 1
        assert rows[1]["judge/questions"] == rows[1]["judge/comparisons"] * 4 * 2  # 4 prompts, 2 votes
        assert {len(json.loads(line)["anchors"]) for line in (workdir / "anchors.jsonl").open()} == {3}
    if kind == "prc":  # the P(A) histogram: ten shares summing to one
        assert sum(rows[1][f"prc/p_bin{k}"] for k in range(10)) == pytest.approx(1.0)
    if kind != "irpo":  # reward fidelity against the oracle (kendall_tau is NaN when every group is flat)
        assert 0 <= rows[1]["fidelity/advantage_error"] < 3 and "fidelity/kendall_tau" in rows[1]
    if kind == "rlvr":  # +1 / -1 rewards; oracle quality is the verdicts' accuracy
        assert -1 <= rows[1]["reward/mean"] <= 1 and 0 <= rows[1]["reward/verdict_accuracy"] <= 1
        assert rows[1]["reward/mean"] == pytest.approx(2 * rows[1]["oracle_quality"] - 1, abs=1e-6)
    assert (workdir / "hf_export" / "model.safetensors").is_file()
    assert (workdir / "tensorboard").is_dir()


def test_config_validation_errors():
    for field, value, match in [("reward.kind", "ppo", "reward.kind"), ("rl.group_size", 1, "rl.group_size"),
                                ("rl.minibatch_size", 7, "rl.minibatch_size"), ("reward.scr.ties", "win",
                                                                                 "reward.scr.ties"),
                                ("rl.loss_aggregation", "sum", "rl.loss_aggregation"),
                                ("rl.micro_batch_size", 5, "rl.micro_batch_size"), ("rl.top_p", 0.0, "rl.top_p"),
                                ("reward.prc.reference", "frozen", "reward.prc.reference"),
                                ("reward.scr.ordering", "swiss", "reward.scr.ordering"),
                                ("rl.learning_rate", -1.0, "rl.learning_rate: -1.0 must be > 0"),
                                ("rl.grad_clip", -1.0, "rl.grad_clip"), ("rl.eps_high", -0.1, "rl.eps_high"),
                                ("rl.eps_low", 1.0, "rl.eps_low"), ("reward.agr.alpha", 0.0, "reward.agr.alpha"),
                                ("data.eval_prompts", -1, "data"), ("toy.min_len", 9, "toy"),
                                ("toy.grm_steps", -1, "toy.grm_steps: -1 must be >= 0"),
                                ("toy.miscount", 1.5, r"toy.miscount: 1.5 must be in \[0, 1\]"),
                                ("toy.cache_dir", "", "toy.cache_dir: empty"),
                                ("distributed.num_processes", 2, "distributed.coordinator: empty"),
                                ("distributed.coordinator", "h:1", "distributed.num_processes: 0 must be >= 1")]:
        c = base_config("scr")
        *path, leaf = field.split(".")
        node = c
        for p in path:
            node = node[p]
        node[leaf] = value
        with pytest.raises(ConfigError, match=match):
            validate(c)
    c = base_config("scr")
    c.reward.scr.cara, c.reward.scr.ordering = True, "knockout"
    with pytest.raises(ConfigError, match="reward.scr.cara"):
        validate(c)
    c = base_config("pointwise")  # the judged win rate asks pairwise questions
    with pytest.raises(ConfigError, match="eval.judge_votes"):
        validate(c)


def test_defaults_follow_the_papers_as_printed():
    """AGR: a tie counts as a win (Algorithm 2 line 10); SCR: a strict majority (Eq. 16); alpha = 0.1, n = 8."""
    c = base_config("agr")
    assert c.reward.agr.ties == "win" and c.reward.scr.ties == "zero"
    assert c.reward.scr.alpha == c.reward.agr.alpha == 0.1 and c.reward.agr.n_anchors == 8
    assert c.reward.prc.reference == "current"


def test_unknown_key_and_missing_model_stop_startup(tmp_path, toy_cache):
    for key, value, line in [
            ("reward.judge.votez", 2, "error: --config.reward.judge.votez: no such field; did you mean "
                                      "--config.reward.judge.votes?"),
            ("rl.learning_rate", "abc", "error: --config.rl.learning_rate=abc: not a float (default 0.0002)")]:
        out = subprocess.run(cli_args(tmp_path, toy_cache, **{key: value}), capture_output=True, text=True,
                             timeout=300, cwd=REPO)
        assert out.returncode == 2 and out.stderr.strip() == line  # one line, before anything loads
    bad = tmp_path / "broken.py"
    bad.write_text("def get_config(:\n")
    out = subprocess.run([sys.executable, "-m", "rrc_jax.train", f"--config={bad}"], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 2 and out.stderr.startswith(f"error: --config={bad} does not load (line 1)")
    assert len(out.stderr.strip().splitlines()) == 1
    out = subprocess.run(cli_args(tmp_path / "w", toy_cache, **{"models.grm": str(tmp_path / "nope")}),
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("error: config.models.grm")


def test_an_override_without_a_config_names_the_missing_flag():
    from rrc_jax.config import check_config_argv

    with pytest.raises(ConfigError, match=r"^--config.models.policy=qwen3-8b: overrides a config, and no --config"):
        check_config_argv(["plan", "--config.models.policy=qwen3-8b"])
    check_config_argv(["plan", "--topology=v5e-64"])  # no config, no override: the command's own default


def test_user_errors_are_one_line_and_internal_errors_keep_their_traceback():
    from rrc_jax.cli import exit_on_user_error

    def fail(error):
        raise error

    with pytest.raises(SystemExit, match="^error: config.rl.beta: -1 must be >= 0$"):
        exit_on_user_error(fail, ConfigError("config.rl.beta: -1 must be >= 0"))
    from rrc_jax.errors import Diverged

    with pytest.raises(SystemExit) as stopped:  # a run stopped by its divergence guard: one line, exit status 3
        exit_on_user_error(fail, Diverged("step 3: the policy has non-finite parameters"))
    assert stopped.value.code == 3
    with pytest.raises(ValueError, match="do not broadcast"):  # a bug, not a setting: the traceback stays
        exit_on_user_error(fail, ValueError("shapes (3,) and (4,) do not broadcast"))


def test_packaged_config_from_any_directory_and_a_plug_in_reward(tmp_path, toy_cache):
    """`--config=agr.py` run from another directory finds the packaged config; `reward.kind=MODULE:FUNCTION` with
    a module outside the package (on PYTHONPATH) trains: `reward/mean` of each step is the mean of what the
    function returned for that step's responses, and none of AGR's machinery is built."""
    plugin = tmp_path / "plugins"
    plugin.mkdir()
    log = tmp_path / "returned.jsonl"
    (plugin / "my_rewards.py").write_text(f'''
import json

def digit_sum(prompts, responses):
    out = [[float(sum(int(c) for c in r if c.isdigit()) % 7) for r in group] for group in responses]
    with open({str(log)!r}, "a") as f:
        f.write(json.dumps(out) + "\\n")
    return out
''')
    cmd = cli_args(tmp_path / "w", toy_cache, kind="agr", **{"reward.kind": "my_rewards:digit_sum"})
    assert cmd[3] == "--config=agr.py"
    env = {**os.environ, "PYTHONPATH": str(plugin)}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = read_metrics(tmp_path / "w")
    returned = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(rows) == [0, 1, 2] and len(returned) == 2
    for step, r in zip((1, 2), returned):
        assert rows[step]["reward/mean"] == pytest.approx(float(np.mean(r)), rel=1e-6)
    assert not (tmp_path / "w" / "anchors.jsonl").exists() and "judge/questions" not in rows[1]
    assert "eval/win_rate_vs_reference" not in rows[2]
    for old, new, message in [("my_rewards:digit_sum", "my_rewards:nope", "has no 'nope'"),
                              ("--config=agr.py", "--config=nope.py", "error: --config=nope.py")]:
        fresh = [a.replace(old, new).replace(str(tmp_path / "w"), str(tmp_path / "w2")) for a in cmd]  # new workdir
        bad = subprocess.run(fresh, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
        assert bad.returncode != 0 and message in bad.stderr.strip().splitlines()[-1], bad.stderr[-500:]


def test_nan_update_is_skipped_and_counted(tmp_path, toy_cache, monkeypatch):
    real = trainer_lib.group_advantages
    calls = []

    def poisoned(r, estimator):
        calls.append(1)
        adv = np.asarray(real(r, estimator))
        return np.full_like(adv, np.nan) if len(calls) == 2 else adv

    monkeypatch.setattr(trainer_lib, "group_advantages", poisoned)
    rows = read_metrics(run(validate(tiny_config("drm", tmp_path, toy_cache))))
    updates = 4 * 4 // 8
    assert rows[1]["skipped_updates"] == 0
    assert rows[2]["skipped_updates"] == updates and rows[2]["loss"] is None  # NaN is written as null


@pytest.mark.parametrize("kind", ["scr", "agr", "prc"])
def test_sample_dump_reproduces_the_rewards(kind, finished):
    """samples/step_1.jsonl holds each dumped prompt's responses with their rewards and every judgment behind them:
    the rewards recomputed from the dumped verdicts with the rewards library are the ones the step trained on."""
    from rrc_jax.rewards import agr_rewards, cara_rewards, prc_rewards

    workdir = finished(kind)
    config = json.loads((workdir / "config.json").read_text())
    records = [json.loads(line) for line in (workdir / "samples" / "step_1.jsonl").read_text().splitlines()]
    assert len(records) == min(config["log"]["samples_prompts"], config["rl"]["prompts_per_step"])
    assert sorted((workdir / "samples").iterdir())[0].name == "step_1.jsonl"
    m, votes = config["rl"]["group_size"], config["reward"]["judge"]["votes"]
    for rec in records:
        logged = np.array([r["reward"] for r in rec["responses"]], np.float32)
        assert [r["i"] for r in rec["responses"]] == list(range(m)) and rec["prompt"]
        js = rec["judgments"]
        if kind == "scr":  # every pair i < j, `votes` times; CARA on the counts
            assert len(js) == m * (m - 1) // 2 * votes
            counts = np.zeros((1, m, m), np.int32)
            for j in js:
                if j["winner"] is not None:
                    won, lost = (j["i"], j["j"]) if j["winner"] == "a" else (j["j"], j["i"])
                    counts[0, won, lost] += 1
            s = config["reward"]["scr"]
            recomputed = cara_rewards(counts, alpha=s["alpha"], method=s["cara_method"])[0]
        elif kind == "agr":  # every response against every anchor of its prompt
            n = config["reward"]["agr"]["n_anchors"]
            assert len(rec["anchors"]) == n and len(js) == m * n * votes
            wins, losses = np.zeros((1, m, n), np.int32), np.zeros((1, m, n), np.int32)
            for j in js:
                if j["winner"] is not None:
                    (wins if j["winner"] == "a" else losses)[0, j["i"], j["anchor"]] += 1
            a = config["reward"]["agr"]
            recomputed = np.asarray(agr_rewards(wins, losses, alpha=a["alpha"], ties=a["ties"]))[0]
        else:  # PRC: P(A) of each response against the reference
            assert isinstance(rec["reference"], str) and sorted(j["i"] for j in js) == list(range(m))
            p_a = np.zeros((1, m), np.float32)
            for j in js:
                p_a[0, j["i"]] = j["p_a"]
            recomputed = np.asarray(prc_rewards(p_a))[0]
        np.testing.assert_allclose(recomputed, logged, atol=1e-6)
        for j in js:
            assert "text" in j and (kind == "prc" or j["verdict"] in ("A", "B", None))


def test_an_abstaining_judge_raises_the_alarms_and_metrics_stay_strict_json(tmp_path, toy_cache, monkeypatch,
                                                                             capsys):
    """A judge that never gives a verdict: the abstention alarm and the flat-reward alarm fire once each, every
    step is counted as zero-signal, every metrics line is strict JSON (no bare NaN), and the non-interactive
    progress bar writes whole lines, not redraws."""
    from rrc_jax.judge import judge as judge_lib

    monkeypatch.setattr(judge_lib, "parse_verdict", lambda text: None)
    workdir = run(validate(tiny_config("scr", tmp_path, toy_cache, **{"log.flat_alarm_steps": 2})))
    err = capsys.readouterr().err
    assert err.count("warning: step 1: the judge abstained on 100% of its") == 1
    assert err.count("warning: every group's reward was flat for 2 steps in a row") == 1
    assert "\r" not in err and sum("train" in line for line in err.splitlines()) <= 4

    def strict(constant):
        raise ValueError(f"bare {constant} in metrics.jsonl")

    rows = [json.loads(line, parse_constant=strict) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in rows}
    assert steps[1]["reward/zero_signal"] == steps[2]["reward/zero_signal"] == 1.0
    assert steps[2]["judge/abstain_rate"] == 1.0 and steps[2]["fidelity/kendall_tau"] is None
    assert steps[2]["eval/win_rate_vs_reference"] is None  # no rate from nothing
    assert steps[2]["eval/decided_win_rate_vs_reference"] is None


def test_greedy_repeated_votes_warn():
    from rrc_jax.rl.alarms import config_warnings

    c = base_config("scr")
    warnings = lambda uses_judge=True: config_warnings(validate(c).judge, c.eval.judge_votes, uses_judge)
    c.reward.judge.temperature, c.reward.judge.votes = 0.0, 4
    (warning,) = warnings()
    assert "reward.judge.votes=4 with a greedy judge" in warning and "reward.judge.votes=2" in warning
    c.reward.judge.votes = 2  # with swap, the two A/B orders: two distinct greedy votes
    assert warnings() == [] and warnings(uses_judge=False) == []
    c.reward.judge.temperature, c.reward.judge.votes = 1.0, 8
    assert warnings() == []


def test_rollout_logprobs_are_at_the_sampling_temperature(tmp_path, toy_cache, monkeypatch):
    """pi_theta_old (and the reference, with beta > 0) are log-probabilities of softmax(logits / rl.temperature),
    the distribution the rollouts were sampled from; the loss uses the same temperature and Dr.GRPO's constant is
    rl.max_new_tokens."""
    seen, objectives = [], []
    real_objective = trainer_lib.grpo_objective
    monkeypatch.setattr(trainer_lib, "grpo_objective", lambda **kw: objectives.append(kw) or real_objective(**kw))
    trainer = Trainer(validate(tiny_config("drm", tmp_path, toy_cache, **{"rl.temperature": 0.6, "rl.beta": 0.1,
                                                               "rl.loss_aggregation": "seq_mean_token_sum_norm",
                                                               "rl.minibatch_size": 4})))  # 2 updates: old_logp
    assert objectives == [dict(temperature=0.6, eps_low=0.2, eps_high=0.2, beta=0.1,
                               aggregation="seq_mean_token_sum_norm", max_len=8, chunk_size=128, remat=False,
                               loss="grpo")]
    monkeypatch.setattr(trainer.learner, "update", lambda batch: seen.append(batch) or {"loss": 0.0, "skipped": 0})
    batch = sample_groups(trainer.sampler, trainer.tokenizer, trainer.train_prompts, ["1234>", "9876>"],
                          trainer.settings.rollout, jax.random.key(0)).batch(trainer.sampler.pad_id)
    trainer.update(batch, np.zeros(8), jax.random.key(1))
    logits = trainer.policy(jnp.asarray(batch["ids"]), jnp.asarray(batch["mask"]))
    want = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits / 0.6, axis=-1))[:, :-1],
                              batch["ids"][:, 1:, None], -1)[..., 0]
    mb = seen[0]
    order = np.asarray([np.flatnonzero((batch["ids"] == row).all(1))[0] for row in np.asarray(mb["ids"])])
    np.testing.assert_allclose(np.asarray(mb["old_logp"])[:, 1:], want[order], atol=1e-5)
    np.testing.assert_allclose(np.asarray(mb["ref_logp"]), np.asarray(mb["old_logp"]), atol=1e-5)  # ref = initial


def test_init_from_sets_the_policy_and_the_reference(tmp_path, toy_cache, finished):
    from flax import nnx

    first = finished("drm")
    config = tiny_config("drm", tmp_path / "second", toy_cache, init_from=str(first / "checkpoints"),
                         **{"rl.beta": 0.1})
    trainer = Trainer(validate(config))
    pure = lambda m: nnx.to_pure_dict(nnx.state(m, nnx.Param))
    trained = load_hf(first / "hf_export")  # the first run's final policy = its last checkpoint
    for model in (trainer.policy, trainer.roles.model("reference")):
        for a, b in zip(jax_leaves(pure(model)), jax_leaves(pure(trained))):
            np.testing.assert_array_equal(a, b)
    fresh = Trainer(validate(tiny_config("drm", tmp_path / "third", toy_cache, **{"rl.beta": 0.1})))
    assert any(not np.array_equal(a, b) for a, b in zip(jax_leaves(pure(fresh.roles.model("reference"))),
                                                         jax_leaves(pure(trained))))


def jax_leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_only_the_roles_a_run_needs_are_built(tmp_path):
    """AGR on real (tiny) checkpoints with `models.drm` left at 'toy': the toy world is never built, the DRM never
    loaded."""
    from conftest import make_hf_model
    from rrc_jax.models.char_tokenizer import make_char_tokenizer

    ckpt = tmp_path / "ckpt"
    make_hf_model("llama3_tied", seed=2, vocab_size=112).save_pretrained(ckpt)
    make_char_tokenizer().save_pretrained(ckpt)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"sort {i} {i + 3}"}) + "\n" for i in range(20)))
    cache = tmp_path / "toy_cache"
    cache.mkdir()
    config = tiny_config("agr", tmp_path / "w", cache, steps=1, **{
        "models.policy": str(ckpt), "models.grm": str(ckpt), "data.path": str(data), "eval.every": 0,
        "toy.train_prompts": 0})
    trainer = Trainer(validate(config))
    trainer.run()
    assert sorted(trainer.roles.loaded) == ["grm", "policy", "reference"]  # reference: AGR's anchors
    assert list(cache.iterdir()) == []
    assert read_metrics(tmp_path / "w")[1]["judge/questions"] == 4 * 4 * 2 * 2


def test_bfloat16_roles_keep_float32_master_weights_for_the_policy(tmp_path):
    """`models.dtype=bfloat16`: every role computes in it and the frozen ones are stored in it; the policy's
    parameters (and so its optimizer state) stay float32."""
    from conftest import make_hf_model

    from rrc_jax.rl.roles import Roles

    ckpt = tmp_path / "ckpt"
    make_hf_model("llama3_tied", seed=2).save_pretrained(ckpt)
    roles = Roles.of_run(validate(tiny_config("agr", tmp_path / "w", tmp_path / "cache", **{
        "models.policy": str(ckpt), "models.grm": str(ckpt), "models.dtype": "bfloat16"})))
    dtypes = {role: {str(x.dtype) for x in jax.tree.leaves(nnx.state(roles.model(role), nnx.Param))}
              for role in ("policy", "reference", "grm")}
    assert dtypes == {"policy": {"float32"}, "grm": {"bfloat16"}, "reference": {"bfloat16"}}
    assert {roles.model(role).cfg.compute_dtype for role in dtypes} == {jnp.dtype(jnp.bfloat16)}


def test_anchors_are_stored_and_reused(toy_cache, finished):
    workdir = finished("agr")
    config = tiny_config("agr", workdir, toy_cache)
    path = workdir / "anchors.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 64 and all(len(r["anchors"]) == 2 for r in rows)
    stamp = path.stat().st_mtime_ns
    trainer = Trainer(validate(config))
    assert path.stat().st_mtime_ns == stamp and "reference" not in trainer.roles.loaded  # read, not regenerated
    assert trainer.reward.store.anchors == load_anchors(path, [r["id"] for r in rows],
                                                           [r["prompt"] for r in rows], 2)
    with pytest.raises(ConfigError, match="different prompt"):
        load_anchors(path, [rows[0]["id"]], ["not the prompt"], 2)


def test_anchors_cli_writes_the_file(tmp_path, toy_cache):
    out = subprocess.run(cli_args(tmp_path, toy_cache, module="rrc_jax.anchors", **{"reward.agr.n_anchors": 3}),
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "anchors.jsonl").read_text().splitlines()]
    assert len(rows) == 64 and {len(r["anchors"]) for r in rows} == {3}
    assert len({r["id"] for r in rows}) == 64


def test_hf_export_matches_the_trained_policy(tmp_path, toy_cache, finished):
    from transformers import AutoModelForCausalLM

    from rrc_jax.checkpoint import Checkpointer

    workdir = finished("drm")
    policy = Trainer(validate(tiny_config("drm", tmp_path, toy_cache))).policy
    assert Checkpointer(workdir / "checkpoints").restore_params(policy) == 2
    ids = jnp.asarray(np.random.default_rng(0).integers(3, policy.cfg.vocab_size, (3, 12)))
    ours = np.asarray(policy(ids))
    exported = AutoModelForCausalLM.from_pretrained(workdir / "hf_export", dtype=torch.float32).eval()
    with torch.no_grad():
        ref = exported(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4)
    np.testing.assert_allclose(np.asarray(load_hf(workdir / "hf_export")(ids)), ours, atol=1e-5)


@pytest.mark.slow  # exact resume after SIGKILL: test_faults (an AGR refresh) and test_multihost; the lock: below
def test_resume_after_sigkill_gives_identical_metrics(tmp_path, toy_cache):
    """A 4-step run, and a command-line run SIGKILLed three times just after logging step 3 (once its step-2
    checkpoint is committed) and restarted each time with the same command, log the same losses and rewards for steps 3-4, and
    every step once: each restart drops the lines logged after the checkpoint it resumes (and takes over the lock
    its killed predecessor left)."""
    overrides = {"steps": 4, "checkpoint.save_every": 2, "eval.every": 2}
    straight = run(validate(tiny_config("agr", tmp_path / "straight", toy_cache, **overrides)))  # also builds the toy world
    killed = tmp_path / "killed"
    cmd = cli_args(killed, toy_cache, **overrides)
    metrics = killed / "metrics.jsonl"

    def past_step_2_checkpoint_since(t0):
        """Step 3 logged by this process and the step-2 checkpoint committed: the save is asynchronous, so on a
        loaded machine step 3 can be logged before Orbax renames the step-2 directory into place."""
        if not metrics.exists() or metrics.stat().st_mtime < t0:
            return False
        lines = metrics.read_text().splitlines()
        return bool(lines) and json.loads(lines[-1])["step"] == 3 and (killed / "checkpoints" / "2").is_dir()

    for attempt in range(3):
        t0 = time.time()
        log = tmp_path / f"killed_{attempt}.log"
        with log.open("w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)
            while not past_step_2_checkpoint_since(t0) and proc.poll() is None and time.time() < t0 + 600:
                time.sleep(0.05)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL, log.read_text()[-2000:]  # killed, not ended on its own
        assert (killed / "checkpoints" / "2").is_dir() and not (killed / "checkpoints" / "4").exists()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert "took over a stale lock" in out.stderr
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [0, 1, 2, 3, 4]
    a, b = read_metrics(straight), read_metrics(killed)
    for step in (3, 4):
        for key in ("loss", "policy_loss", "reward/mean", "reward/std", "oracle_quality"):
            assert a[step][key] == b[step][key], (step, key)


@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM],
                         ids=["ctrl_c", "sigterm"])  # one handler for both (checkpoint.StopSignals)
def test_interrupt_saves_a_checkpoint_and_exits_cleanly(tmp_path, toy_cache, signum):
    """Ctrl-C, or SIGTERM (a preempted Cloud TPU VM), during a step: that step's checkpoint, exit 128 + signal."""
    Trainer(validate(tiny_config("drm", tmp_path / "warm", toy_cache)))  # toy world ready
    workdir = tmp_path / "run"
    cmd = cli_args(workdir, toy_cache, kind="drm", **{"steps": 50, "checkpoint.save_every": 0, "eval.every": 0})
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        metrics = workdir / "metrics.jsonl"
        if metrics.is_file() and any(json.loads(line)["step"] >= 1 for line in metrics.read_text().splitlines()):
            break
        time.sleep(0.05)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signum, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    saved = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    last = max(json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines())
    assert saved == [last] and 1 <= last < 50
    assert f"interrupted ({signal.Signals(signum).name}): checkpoint of step" in err


def test_prompts_from_files_folders_and_conversations(tmp_path, toy_cache, capsys):
    """The main job trains on a csv with held-out prompts from a .jsonl.gz; a save_to_disk folder and a jsonl of
    chat conversations load too; the split is stated and can be turned off; a conversation reaches the policy whole
    (system message included) through its chat template, while the judge reads it as one text."""
    import gzip

    import datasets

    from rrc_jax.data.prompts import load_prompts, prompt_tokens
    from rrc_jax.data.toy import SortTask
    from rrc_jax.models.char_tokenizer import make_char_tokenizer

    rng = np.random.default_rng(0)
    task = SortTask()
    texts = [task.prompt_text(task.prompt(rng)) for _ in range(48)]
    csv = tmp_path / "prompts.csv"
    long = "1" * 299 + ">"  # 300 tokens: more than the toy policy's 256-token context fits
    csv.write_text("prompt,source\n" + "".join(f"{t},toy\n" for t in texts[:40]) + ",empty\n" + f"{long},long\n")
    held = tmp_path / "held.jsonl.gz"
    with gzip.open(held, "wt") as f:
        f.write("".join(json.dumps({"prompt": t}) + "\n" for t in texts[40:]))
    config = tiny_config("drm", tmp_path / "w", toy_cache, **{"data.path": str(csv), "data.eval_path": str(held)})
    metrics = read_metrics(run(validate(config)))
    assert "reward/mean" in metrics[2] and "oracle_quality" not in metrics[2]  # no oracle for file prompts
    assert metrics[0]["data/dropped_long"] == 1 and metrics[0]["data/unusable_dropped"] == 1
    assert "data: 41 training rows from" in capsys.readouterr().err
    train, ev = load_prompts(validate(config).prompts)  # no length limit
    assert train.texts == texts[:40] + [long] and ev.texts == texts[40:] and not set(train.ids) & set(ev.ids)

    folder = tmp_path / "saved"
    datasets.Dataset.from_dict({"prompt": texts}).save_to_disk(str(folder))
    config.data.path, config.data.eval_path = str(folder), ""
    train, ev = load_prompts(validate(config).prompts)
    assert train.texts + ev.texts == texts and len(ev.texts) == 4
    assert "held out: 4, the last 4 rows of" in capsys.readouterr().err
    config.data.eval_prompts = 0  # no held-out split
    train, ev = load_prompts(validate(config).prompts)
    assert train.texts == texts and ev.texts == [] and "held out: 0, none" in capsys.readouterr().err

    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3 1 2"},
            {"role": "assistant", "content": "1 2 3"}, {"role": "user", "content": "2 1"}]
    rows = [{"prompt": chat}, {"prompt": [{"role": "user", "content": "9 8"}]}, {"prompt": ""},
            {"prompt": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}]  # ends on no user
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(r) + "\n" for r in rows * 5))
    config.data.path = str(chats)
    train, _ = load_prompts(validate(config).prompts)
    assert len(train.texts) == 10  # the empty prompt and the conversation without a final user turn are dropped
    judge_view = "System: be brief\n\nUser: 3 1 2\n\nAssistant: 1 2 3\n\nUser: 2 1"
    assert train.texts[:2] == [judge_view, "9 8"]
    tok = make_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    seen = tok.decode(prompt_tokens(tok, train, judge_view))
    assert seen == "<system>be brief\n<user>3 1 2\n<assistant>1 2 3\n<user>2 1\n<assistant>"
    assert tok.decode(prompt_tokens(tok, train, "9 8")) == "<user>9 8\n<assistant>"
    config.data.field = "question"
    with pytest.raises(ConfigError, match="config.data.field: .* has no field 'question'"):
        load_prompts(validate(config).prompts)


def test_anchor_refresh_regenerates_from_the_policy(tmp_path, toy_cache, finished):
    """Without refresh the anchors stay those of the reference; with `refresh_every=1` step 2 judges against
    samples of the current policy, written to their own versioned file (the reference's file is left as it was)."""
    fixed = finished("agr")
    refreshed = tmp_path / "refreshed"
    rows = read_metrics(run(validate(tiny_config("agr", refreshed, toy_cache, **{"reward.agr.refresh_every": 1}))))
    assert np.isfinite(rows[2]["reward/mean"])
    a = (fixed / "anchors.jsonl").read_text().splitlines()
    assert (refreshed / "anchors.jsonl").read_text().splitlines() == a  # the same reference, the same seed
    b = (refreshed / "anchors_refreshed" / "step_2.jsonl").read_text().splitlines()
    assert len(a) == len(b) == 64 and a != b


@pytest.mark.parametrize("config_file,kind", [("grm_sft", "grm"), ("drm_bt", "drm")])
def test_train_rm_cli_exports_a_reward_model(tmp_path, config_file, kind):
    cmd = [sys.executable, "-m", "rrc_jax.train_rm", f"--config={config_file}.py",
           f"--config.workdir={tmp_path}", "--config.train.steps=3", "--config.train.batch_size=8",
           "--config.model.hidden=32", "--config.model.layers=1", "--config.toy.eval_pairs=8"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    model = load_hf(tmp_path / "hf_export")
    assert model.cfg.value_head == (kind == "drm")
    assert json.loads((tmp_path / "eval.json").read_text())["examples"] == 8  # held-out toy pairs
    if kind == "drm":
        return  # the data checks below are the schema's, the same for both recipes
    for extra, message in ((["--config.data.path=/data/helpsteer3.jsonl"], "error: config.model.init"),
                           (["--config.data.path=/data/helpsteer3.jsonl", f"--config.model.init={tmp_path}"],
                            "/data/helpsteer3.jsonl")):
        bad = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        last = bad.stderr.strip().splitlines()[-1]
        assert bad.returncode != 0 and last.startswith("error:") and message in last, last


def test_a_second_trainer_on_a_locked_workdir_stops_with_one_line(tmp_path, toy_cache):
    """The workdir lock (`rrc_jax.workdir`): held by a live process, a second trainer exits with one line naming the
    holder; a lock whose holder died is taken over."""
    from rrc_jax.workdir import WorkdirLock

    workdir = tmp_path / "w"
    with WorkdirLock(workdir):
        out = subprocess.run(cli_args(workdir, toy_cache, kind="drm"), capture_output=True, text=True, timeout=300,
                             cwd=REPO)
    assert out.returncode == 1, out.stderr[-2000:]
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"error: {workdir} is in use by another trainer (host ") and f"pid {os.getpid()}" in line
    (workdir / ".lock.owner").write_text("host gone pid 1 since then\n")  # a holder killed without releasing
    with WorkdirLock(workdir) as lock:
        assert f"pid {os.getpid()}" in lock.owner.read_text()
    assert not (workdir / ".lock.owner").exists()


def test_resume_refuses_a_changed_config_and_a_diverging_run_stops_before_saving(tmp_path, toy_cache, finished):
    """Resuming a finished 2-step run: with rl.group_size changed it is refused before any model loads; with
    rl.learning_rate=1e30 and resume.allow_changes it explodes at step 3, stops with `Diverged`, and leaves the
    step-2 checkpoint as the workdir's latest, no export, and both configs (the first one versioned)."""
    import shutil

    from rrc_jax.errors import Diverged

    workdir = tmp_path / "w"
    shutil.copytree(finished("drm"), workdir)
    shutil.rmtree(workdir / "hf_export")
    config = tiny_config("drm", workdir, toy_cache, **{"rl.group_size": 8, "steps": 3})
    with pytest.raises(ConfigError, match=r"holds a checkpoint trained under another config; changed: "
                                          r"rl.group_size: 4 -> 8\. .*--config.resume.allow_changes=True"):
        run(validate(config))
    config = tiny_config("drm", workdir, toy_cache, **{"rl.learning_rate": 1e30, "steps": 3,
                                                        "resume.allow_changes": True})
    with pytest.raises(Diverged, match="step 3: the policy"):
        run(validate(config))
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]
    assert not (workdir / "hf_export").exists()
    assert json.loads((workdir / "config.v1.json").read_text())["rl"]["learning_rate"] == 2e-4
    assert json.loads((workdir / "config.json").read_text())["rl"]["learning_rate"] == 1e30

