"""Reward-model recipes on preference data: GRM SFT (Eq. 2) and DRM Bradley-Terry (Eq. 1) fine-tuning a Hugging Face
checkpoint on a pairs file (held-out split, over-long examples dropped and counted, margin and centering; the run's
metrics, TensorBoard, checkpoints and exact resume after SIGTERM), and RLVR's pieces (judge questions with known
verdicts, the +1 / -1 reward of RM-R1 Eq. 8)."""

import json
import os
import signal

import numpy as np
import pytest
from flax import nnx

from rrc_jax.config import rm_config, settings_of, validate
from rrc_jax.data.preferences import Preference
from rrc_jax.data.prompts import judge_questions
from rrc_jax.errors import ConfigError
from rrc_jax.models import Decoder, DecoderConfig, load_hf, save_hf
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.constructions.rlvr import RLVRReward
from rrc_jax.rm.recipes import split_held_out
from rrc_jax.sharding import model_context
from rrc_jax.train_rm import train_reward_model


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A tiny random Llama with the character tokenizer, saved as a Hugging Face directory."""
    tokenizer = make_char_tokenizer()
    cfg = DecoderConfig(model_type="llama", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=1024,
                        bos_token_id=1, eos_token_ids=(2,), pad_token_id=0)
    with model_context(None):
        model = Decoder(cfg, rngs=nnx.Rngs(0))
    path = tmp_path_factory.mktemp("tiny_hf")
    save_hf(model, path, tokenizer=tokenizer)
    return path


def pairs_file(path, n=30, long=2):
    """`n` pairs (chosen: the sorted digits) and `long` whose responses are far longer than the rest."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n + long):
        digits = "".join(map(str, rng.integers(0, 10, 5)))
        chosen, rejected = "".join(sorted(digits)), digits
        if i >= n:
            chosen, rejected = chosen * 40, rejected * 40
        rows.append({"prompt": f"sort {digits}", "chosen": chosen, "rejected": rejected,
                     "rationale": f"sorted is {''.join(sorted(digits))}", "strength": 1 + i % 3})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rm(kind, workdir, data, init, **overrides):
    c = rm_config(kind)
    c.update_from_flattened_dict({"workdir": str(workdir), "data.path": str(data), "data.format": "pairs",
                                  "model.init": str(init), "data.max_tokens": 200, "train.steps": 3,
                                  "train.batch_size": 4, "judge.template": "toy_pairwise_cot",
                                  "judge.max_new_tokens": 8, **overrides})
    return c


def metrics(workdir):
    """The rows of `metrics.jsonl`, strict JSON (a bare NaN fails)."""

    def refuse(constant):
        raise ValueError(f"bare {constant} in metrics.jsonl")

    return [json.loads(line, parse_constant=refuse) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def tensorboard_steps(workdir, tag):
    """The steps TensorBoard shows for `tag` (the real reader, purge events honoured)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(workdir / "tensorboard"))
    accumulator.Reload()
    return [e.step for e in accumulator.Scalars(tag)]


def parameters(path):
    return {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(load_hf(path), nnx.Param))}


def test_grm_sft_on_a_pairs_file(tmp_path, tiny_hf):
    data = pairs_file(tmp_path / "pairs.jsonl")
    out = train_reward_model(settings_of(rm("grm", tmp_path / "grm", data, tiny_hf, **{"judge.direct_share": 0.5})))
    rows = metrics(tmp_path / "grm")
    counts = rows[0]
    assert counts["data/rows"] == 32 and counts["data/pairs"] == 32
    assert counts["data/held_out_examples"] == 2  # 5% of 32 keys, rounded up
    assert counts["data/too_long_dropped"] == 2 and counts["data/train_examples"] == 28
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and all(np.isfinite(r["loss"]) for r in rows[1:])
    for key in ("grad_norm", "lr", "examples_per_second", "skipped"):
        assert all(np.isfinite(r[key]) for r in rows[1:]), key
    accuracy = rows[3]["eval/accuracy"]  # held out, both orders, last step; null when every vote abstained
    assert rows[3]["eval/examples"] == 2 and (0 <= accuracy <= 1 if accuracy is not None
                                              else rows[3]["eval/abstain_rate"] == 1.0)
    assert json.loads((tmp_path / "grm" / "eval.json").read_text())["examples"] == 2
    assert tensorboard_steps(tmp_path / "grm", "loss") == [1, 2, 3]
    assert tensorboard_steps(tmp_path / "grm", "eval/examples") == [3]
    assert sorted(p.name for p in (tmp_path / "grm" / "checkpoints").iterdir()) == ["3"]  # the last step's
    model = load_hf(out)
    assert not model.cfg.value_head and (out / "tokenizer.json").is_file()


def test_drm_bradley_terry_with_margin_and_centering_resumes_exactly(tmp_path, tiny_hf, monkeypatch):
    """An uninterrupted run, and one stopped by SIGTERM after step 2 then rerun: the rerun resumes from step 2's
    checkpoint (parameters, optimizer state and the batch order) and ends with the same parameters; each step is
    logged once."""
    from rrc_jax.metrics import MetricsLogger

    data = pairs_file(tmp_path / "pairs.jsonl", long=0)
    config = lambda workdir: rm("drm", workdir, data, tiny_hf, **{"train.margin": True, "train.center_coef": 0.01,
                                                                   "checkpoint.save_every": 0})
    out = train_reward_model(settings_of(config(tmp_path / "drm")))
    rows = metrics(tmp_path / "drm")
    assert rows[0]["data/too_long_dropped"] == 0 and "accuracy" in rows[1]
    assert rows[-1]["eval/examples"] == 2 and 0 <= rows[-1]["eval/accuracy"] <= 1
    assert load_hf(out).cfg.value_head  # a value head added to the causal LM and exported as score.weight

    log = MetricsLogger.log

    def preempted_at_step_2(self, step, row):
        log(self, step, row)
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # noted by the loop, which checkpoints step 2 and exits

    monkeypatch.setattr(MetricsLogger, "log", preempted_at_step_2)
    with pytest.raises(SystemExit) as stopped:
        train_reward_model(settings_of(config(tmp_path / "resumed")))
    assert stopped.value.code == 128 + signal.SIGTERM
    assert [r["step"] for r in metrics(tmp_path / "resumed")] == [0, 1, 2]
    monkeypatch.setattr(MetricsLogger, "log", log)
    resumed = train_reward_model(settings_of(config(tmp_path / "resumed")))
    assert [r["step"] for r in metrics(tmp_path / "resumed")] == [0, 1, 2, 3]
    expected, got = parameters(out), parameters(resumed)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=str(name))


def test_a_dataset_needs_a_model_to_fine_tune(tmp_path):
    c = rm("grm", tmp_path / "x", pairs_file(tmp_path / "p.jsonl"), "")
    with pytest.raises(ConfigError, match="config.model.init"):
        train_reward_model(settings_of(c))


def test_held_out_split_keeps_keys_together():
    prefs = [Preference("p", "a", "b", key=f"k{i // 9}") for i in range(9 * 10)]
    train, held = split_held_out(prefs, 0.2, seed=0)
    assert len(held) == 2 * 9 and not {p.key for p in train} & {p.key for p in held}


def test_judge_questions_know_their_verdict_and_rlvr_rewards_it():
    tokenizer = make_char_tokenizer()
    prefs = [Preference(f"q{i}", f"good{i}", f"bad{i}") for i in range(20)]
    questions = judge_questions(prefs, tokenizer, "toy_pairwise_cot", seed=0)
    assert questions.rendered and len(questions.texts) == 20
    letters = ["A" if f"A: good{i}" in t else "B" for i, t in enumerate(questions.texts)]
    assert 0 < letters.count("A") < 20  # the order is drawn per question
    for i, letter in enumerate(letters):
        other = "B" if letter == "A" else "A"
        assert questions.oracle(i, f"think: [[{letter}]]") == 1.0
        assert questions.oracle(i, f"think: [[{other}]]") == 0.0 and questions.oracle(i, "no verdict") == 0.0
    reward = RLVRReward(questions)
    out = reward(questions.texts[:2], [[f"[[{letters[0]}]]", "?"], ["[[A]]", "[[B]]"]], np.array([0, 1]), step=1)
    rewards, logged = out.rewards, out.metrics
    assert rewards[0].tolist() == [1.0, -1.0] and sorted(rewards[1].tolist()) == [-1.0, 1.0]
    assert logged["reward/verdict_accuracy"] == 0.5


def test_pointwise_pairs_and_the_irpo_reward():
    from rrc_jax.data.prompts import pointwise_questions
    from rrc_jax.rewards import rule_rewards
    from rrc_jax.constructions.irpo import IRPOReward, chosen_scored_higher

    tokenizer = make_char_tokenizer()
    questions = pointwise_questions([Preference(f"q{i}", f"good{i}", f"bad{i}") for i in range(3)], tokenizer,
                                    "irpo_pointwise")
    assert questions.paired and len(questions.texts) == 6
    assert "good1" in questions.texts[2] and "bad1" in questions.texts[3]
    with pytest.raises(ConfigError, match="pointwise"):
        pointwise_questions([Preference("q", "a", "b")], tokenizer, "toy_pairwise_cot")

    ok = lambda s: f"<critique>fine</critique>\n<score>{s}</score>"
    responses = [[ok(8), ok(6), "no score"], [ok(5), ok(7), "<score>4</score>"]]  # chosen group, rejected group
    out = IRPOReward("median", "irpo_pointwise")(["c", "r"], responses, np.array([4, 5]), step=1)
    rewards, logged = out.rewards, out.metrics
    s_c, s_r = np.array([[8, 6, np.nan]], np.float32), np.array([[5, 7, 4]], np.float32)
    r_c, r_r = (np.asarray(x) for x in rule_rewards(s_c, s_r, "median"))
    np.testing.assert_allclose(rewards, np.concatenate([r_c, r_r]) + [[0, 0, -0.5], [0, 0, -0.5]])
    assert logged["reward/format_ok"] == pytest.approx(4 / 6) and logged["reward/pair_accuracy"] == 1.0  # 7 > 5.33
    with pytest.raises(ValueError, match="whole pairs"):
        IRPOReward("median", "irpo_pointwise")(["c", "r"], responses, np.array([5, 6]), step=1)
    assert chosen_scored_higher([3, 1, 1, 3, 2, 2, np.nan, 1]).tolist() == [1.0, 0.0, 0.5, 0.5]


def test_irpo_trains_a_pointwise_judge_on_pairs(tmp_path, tiny_hf):
    """Two IRPO steps on a pairs file with a short pointwise template: whole pairs per step, the intergroup and
    format rewards, the held-out pair accuracy."""
    from rrc_jax.config import base_config
    from rrc_jax.data.prompts import prompt_batches
    from rrc_jax.rl.trainer import run

    template = tmp_path / "short_pointwise.json"
    template.write_text(json.dumps({"kind": "pointwise", "context": "Q: {prompt}\n",
                                    "item": "R: {response}\n<critique></critique> <score>", "think": True,
                                    "verdict_prefix": "<score>"}))
    c = base_config("irpo")
    c.update_from_flattened_dict({
        "workdir": str(tmp_path / "irpo"), "steps": 2, "models.policy": str(tiny_hf), "data.path": str(
            pairs_file(tmp_path / "pairs.jsonl", long=0)), "data.format": "pairs", "data.eval_prompts": 4,
        "reward.judge.template": str(template), "rl.prompts_per_step": 4, "rl.group_size": 2,
        "rl.minibatch_size": 8, "rl.max_new_tokens": 6, "eval.judge_votes": 0, "checkpoint.save_every": 0})
    workdir = run(validate(c))
    rows = metrics(workdir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for key in ("reward/pair_accuracy", "reward/format_ok", "loss"):
        assert key in rows[1], key
    assert 0 <= rows[2]["eval/oracle_quality"] <= 1  # held-out pairs, greedy scores
    batches = prompt_batches(c.rl.prompts_per_step, c.seed, 20, paired=True)
    index = next(batches)
    assert len(index) == 4 and (index[0::2] % 2 == 0).all() and (index[1::2] == index[0::2] + 1).all()
