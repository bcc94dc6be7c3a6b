"""Reward constructions against scripted samplers, without the toy world: position-balanced swapping, PRC's references,
the DRM's own tokenizer, PRC without thinking, templates from files, needed roles only, prompt files."""

import json
import os

import numpy as np
import pytest
from flax import nnx

from rrc_jax import testing
from rrc_jax.config import base_config, validate
from rrc_jax.models.batches import pad_sequences
from rrc_jax.data.prompts import PromptSet, load_prompts
from rrc_jax.errors import ConfigError
from rrc_jax.inference import SamplingParams
from rrc_jax.judge import Judge, get_template, load_template
from rrc_jax.models import Decoder, DecoderConfig, prompt_ids
from rrc_jax.models.char_tokenizer import PRINTABLE, make_char_tokenizer
from rrc_jax.rl.anchor_store import AnchorStore, save_anchors
from rrc_jax.constructions import RewardContext, make_construction
from rrc_jax.constructions.agr import AGRReward
from rrc_jax.constructions.drm import DRMReward
from rrc_jax.constructions.prc import PRCReward
from rrc_jax.constructions.scr import SCRReward
from rrc_jax.sharding import model_context

TOK = make_char_tokenizer()


def TextSampler(answer=lambda text: "[[A]]"):
    """The package's text sampler (`rrc_jax.testing`) over the character tokenizer."""
    return testing.TextSampler(TOK, answer)


def judge_of(sampler, template="toy_pairwise_cot"):
    return Judge(sampler, TOK, template=template, temperature=0.0, max_new_tokens=16)


def groups(b, m):
    return [f"{i}{i}>" for i in range(b)], [[f"{i}{j}" for j in range(m)] for i in range(b)]


# ------------------------------------------------------------------------------------------------------------
# Position bias: a judge that always answers "A"
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("votes", [1, 2, 3])
@pytest.mark.parametrize("ties", ["zero", "half"])
def test_always_a_judge_gives_scr_rewards_independent_of_response_index(votes, ties):
    """Odd group: every response gets the same win count. Even group: every response index gets the same mean
    reward over two prompts. (Showing the first response of every pair as A would reward index 0 most.)"""
    scr = lambda judge: SCRReward(judge, 0, votes=votes, swap=True, alpha=1.0, ties=ties, cara=False,
                                  cara_method="greedy")
    prompts, responses = groups(1, 5)
    r = scr(judge_of(TextSampler()))(prompts, responses, np.arange(1), step=1).rewards
    assert np.ptp(r) == 0, r
    prompts, responses = groups(2, 4)
    r = scr(judge_of(TextSampler()))(prompts, responses, np.arange(2), step=1).rewards
    assert np.ptp(r.mean(axis=0)) == 0, r


@pytest.mark.parametrize("votes", [1, 2, 3])
def test_always_a_judge_gives_agr_rewards_independent_of_response_index(votes, tmp_path):
    prompts, responses = groups(2, 4)
    for n in (4, 3):
        train = PromptSet([0, 1], prompts)
        path = tmp_path / f"anchors{n}.jsonl"
        save_anchors(path, train.ids, prompts, [[f"a{k}" for k in range(n)]] * 2)
        store = AnchorStore(path, train, n, TOK, SamplingParams())
        agr = AGRReward(judge_of(TextSampler()), 0, store=store, votes=votes, swap=True, alpha=1.0, ties="win",
                        refresh_every=0, ctx=None)
        r = agr(prompts, responses, np.arange(2), step=1).rewards
        if n % 2 == 0:
            assert np.ptp(r) == 0, (n, r)  # every response beats the same number of anchors
        assert np.ptp(r.mean(axis=0)) == 0, (n, r)


# ------------------------------------------------------------------------------------------------------------
# PRC: the reference response
# ------------------------------------------------------------------------------------------------------------

def prc_context(policy, reference=None):
    config = base_config("prc")
    ctx = RewardContext(validate(config), roles=None, policy=policy, tokenizer=TOK,
                        train=PromptSet([0, 1, 2], ["12>", "34>", "56>"]))
    ctx._reference = reference
    return ctx


def shown_b(question: str) -> str:
    return question.split("\nB: ")[1].split("\n")[0]


def test_prc_reference_is_the_current_policys_greedy_response():
    version = {"v": "1"}
    policy = TextSampler(lambda prompt: prompt[:2] + version["v"])
    grm = TextSampler()
    prc = PRCReward(judge_of(grm), 0, think=True, reference="current", ctx=prc_context(policy))
    prompts = ["12>", "34>"]
    out = prc(prompts, [["9", "8"], ["7", "6"]], np.array([0, 1]), step=1)
    r, metrics = out.rewards, out.metrics
    assert {shown_b(q) for q in grm.questions} == {"121", "341"}
    np.testing.assert_allclose(r, 0.75)
    assert metrics["reward/prc_saturation"] == 0.0
    version["v"] = "2"  # the policy was updated: the next step's references are its new greedy responses
    grm.questions.clear()
    prc(prompts, [["9", "8"], ["7", "6"]], np.array([0, 1]), step=2)
    assert {shown_b(q) for q in grm.questions} == {"122", "342"}


def test_prc_initial_reference_is_the_frozen_reference_cached_per_prompt():
    policy, reference, grm = TextSampler(lambda p: "0"), TextSampler(lambda p: p[:2] + "r"), TextSampler()
    calls = []
    generate = reference.generate
    reference.generate = lambda ids, *a, **k: calls.append(len(ids)) or generate(ids, *a, **k)
    prc = PRCReward(judge_of(grm), 0, think=True, reference="initial", ctx=prc_context(policy, reference))
    prc(["12>", "34>"], [["9"], ["7"]], np.array([0, 1]), step=1)
    prc(["34>", "56>"], [["9"], ["7"]], np.array([1, 2]), step=2)
    assert calls == [2, 1] and {shown_b(q) for q in grm.questions} == {"12r", "34r", "56r"}


def test_prc_without_thinking_reads_the_configured_judges_direct_template():
    grm = TextSampler()
    prc = PRCReward(judge_of(grm), 0, think=False, reference="current", ctx=prc_context(TextSampler()))
    assert prc.template.name == "toy_pairwise_direct"
    r = prc(["12>"], [["9", "8"]], np.array([0]), step=1).rewards
    assert all(q.endswith("verdict: [[") for q in grm.questions) and len(grm.questions) == 2
    np.testing.assert_allclose(r, 0.75)
    with pytest.raises(ConfigError, match="no direct-verdict variant"):
        PRCReward(judge_of(TextSampler(), "rmr1_cor"), 0, think=False, reference="current", ctx=None)


# ------------------------------------------------------------------------------------------------------------
# DRM: its own tokenizer
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tournament", ["merge_sort", "knockout"])
def test_scr_tournaments_rank_the_group_with_fewer_questions(tournament):
    """A scripted judge that prefers the longer response: the tournament's Eq. 21 rewards put the longest first,
    with fewer questions than the round robin's m(m-1)/2 per vote."""
    def longer(question):
        a, b = (question.split(f"{x}: ")[1].split("\n")[0] for x in "AB")
        return "[[A]]" if len(a) >= len(b) else "[[B]]"

    sampler = TextSampler(longer)
    reward = SCRReward(judge_of(sampler), seed=0, votes=1, swap=True, alpha=0.5, ties="zero", cara=False,
                       cara_method="greedy", ordering=tournament)
    responses = [["1", "1234", "12", "123"], ["55", "5", "5555", "555"]]
    out = reward(["1>", "5>"], responses, np.array([0, 1]), step=1)
    rewards, logged = out.rewards, out.metrics
    assert rewards[0, 1] == 1.5 and rewards[1, 2] == 1.5  # the longest: alpha x (m - 1)
    if tournament == "merge_sort":  # a full order
        np.testing.assert_allclose(rewards, [[0.0, 1.5, 0.5, 1.0], [0.5, 0.0, 1.5, 1.0]])
    assert len(sampler.questions) < 2 * 6 and logged["judge/comparisons"] <= 5
    with pytest.raises(ConfigError, match="ordering"):
        SCRReward(judge_of(sampler), seed=0, votes=1, swap=True, alpha=1.0, ties="zero", cara=False,
                  cara_method="greedy", ordering="swiss")


def test_pointwise_reward_is_the_mean_score_and_an_unscored_response_moves_nothing():
    """Scripted pointwise judge: the score is the response's length; a response 'x' is never scored (abstains)."""
    from rrc_jax.constructions.pointwise import PointwiseReward

    def answer(question):
        response = question.split("A: ")[1].split("\n")[0]
        return "?" if response == "x" else f"score: {len(response)}"

    sampler = TextSampler(answer)
    reward = PointwiseReward(judge_of(sampler, "toy_pointwise"), seed=0, votes=2)
    out = reward(["1>", "2>"], [["1", "123", "x"], ["x", "x", "x"]], np.array([0, 1]), step=1)
    rewards, logged = out.rewards, out.metrics
    np.testing.assert_allclose(rewards, [[1.0, 3.0, 2.0], [0.0, 0.0, 0.0]])  # 'x' gets its group's mean
    assert len(sampler.questions) == 2 * 3 * 2 and logged["judge/questions"] == 12
    assert logged["judge/abstain_rate"] == pytest.approx(8 / 12) and logged["reward/unscored_groups"] == 1.0
    with pytest.raises(ConfigError, match="pointwise"):
        PointwiseReward(judge_of(sampler), seed=0, votes=1)


def test_drm_scores_with_its_own_tokenizer():
    """A DRM whose vocabulary differs from the policy's (the characters in another order, other ids): rewards are
    its value head on the text encoded by *its* tokenizer."""
    drm_tok = make_char_tokenizer(PRINTABLE[::-1])
    cfg = DecoderConfig(model_type="llama", vocab_size=len(drm_tok), hidden_size=16, intermediate_size=32,
                        num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, value_head=True, eos_token_ids=(2,),
                        pad_token_id=0)
    with model_context(None):
        drm = Decoder(cfg, rngs=nnx.Rngs(0))
    drm.value_head.kernel.value = np.random.default_rng(0).normal(size=16).astype(np.float32)
    prompts, responses = ["31415>", "9>"], [["11345", "4"], ["9", "99"]]
    r = DRMReward(drm, drm_tok)(prompts, responses, np.arange(2), step=1).rewards
    rows = [prompt_ids(tok, p) + tok(o, add_special_tokens=False)["input_ids"] + [2]
            for tok in (drm_tok, TOK) for p, group in zip(prompts, responses) for o in group]
    ids, mask = pad_sequences(rows, max(map(len, rows)), 0, "right")
    own, policys = np.asarray(drm.values(ids, mask)).reshape(2, 2, 2)
    np.testing.assert_allclose(r, own, rtol=1e-5, atol=1e-6)
    assert np.abs(policys - r).min() > 1e-4  # the policy's ids would score otherwise


# ------------------------------------------------------------------------------------------------------------
# Templates from files, plug-ins, prompt files
# ------------------------------------------------------------------------------------------------------------

def test_a_judge_template_from_a_json_or_yaml_file(tmp_path):
    fields = {"kind": "pairwise", "context": "Q: {prompt}\n", "item": "A: {a}\nB: {b}\nwhich?", "think": True,
              "direct": {"kind": "pairwise", "context": "Q: {prompt}\n", "item": "A: {a}\nB: {b}\nverdict: ",
                         "think": False}}
    (tmp_path / "mine.json").write_text(json.dumps(fields))
    (tmp_path / "mine.yaml").write_text("kind: pairwise\ncontext: \"Q: {prompt}\\n\"\nitem: \"A: {a} B: {b}\"\n"
                                        "think: false\nsystem: Be fair.\n")
    t = get_template(str(tmp_path / "mine.json"))
    assert (t.name, t.context, t.think, t.direct.name, t.direct.think) == ("mine", "Q: {prompt}\n", True,
                                                                           "mine_direct", False)
    y = load_template(tmp_path / "mine.yaml")
    assert (y.system, y.item, y.think) == ("Be fair.", "A: {a} B: {b}", False)
    grm = TextSampler()
    votes = Judge(grm, TOK, template=str(tmp_path / "mine.json"), max_new_tokens=8).compare(["1>"], ["x"], ["y"])
    assert votes.wins[0] + votes.losses[0] == 1 and grm.questions[0].endswith("which?")
    (tmp_path / "bad.json").write_text(json.dumps({**fields, "answer": "[[A]]"}))
    with pytest.raises(ConfigError, match="unknown field 'answer'"):
        get_template(str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match="does not exist"):
        get_template(str(tmp_path / "missing.yaml"))


def test_plug_in_reward_forms(tmp_path, monkeypatch):
    module = tmp_path / "plug.py"
    module.write_text('''
import numpy as np

def plain(prompts, responses):
    return np.full((len(prompts), len(responses[0])), 2.0)

def full(prompts, responses, prompt_index, step):
    return np.full((len(prompts), len(responses[0])), float(step)), {"mine/step": step}

class Shaped:
    @classmethod
    def from_settings(cls, settings, context):
        return cls()

    def __call__(self, prompts, responses, prompt_index, step):
        return np.zeros((len(prompts), len(responses[0]))), {}
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    config = base_config("agr")
    prompts, responses = groups(2, 3)
    for name, want in [("plain", 2.0), ("full", 5.0), ("Shaped", 0.0)]:
        config.reward.kind = f"plug:{name}"
        r = make_construction(validate(config), None)(prompts, responses, np.arange(2), 5).rewards
        np.testing.assert_array_equal(np.asarray(r), np.full((2, 3), want))
    config.reward.kind = "no_such_module:f"
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'"):
        validate(config)


WRONG_SHAPES = '''
import numpy as np

from rrc_jax.constructions import Construction, RewardResult


def short(prompts, responses):
    return [1.0, 2.0]


def ragged(prompts, responses, prompt_index, step):
    return [[1.0] * (i + 1) for i in range(len(prompts))], {"mine/step": step}


class Transposed(Construction):
    def construct(self, prompts, responses, prompt_index, step):
        return RewardResult(np.zeros((len(responses[0]), len(prompts))))
'''


def test_a_plug_in_reward_of_the_wrong_shape_is_one_line(tmp_path, monkeypatch, toy_cache):
    """A plug-in function, or a user's `Construction`, returning rewards that are not `[B, m]` is a one-line
    `ConfigError` naming it, what it returned and the shape expected; the trainer's command line prints it and
    exits 1."""
    import subprocess

    from conftest import cli_args

    (tmp_path / "wrong_shapes.py").write_text(WRONG_SHAPES)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = base_config("drm")
    prompts, responses = groups(2, 3)
    for name, got in [("short", "shape (2,)"), ("ragged", "a list that is no array of numbers"),
                      ("Transposed", "shape (3, 2)")]:
        config.reward.kind = f"wrong_shapes:{name}"
        with pytest.raises(ConfigError) as e:
            make_construction(validate(config), None)(prompts, responses, np.arange(2), 1)
        assert str(e.value) == (f"config.reward.kind='wrong_shapes:{name}': the plug-in returned rewards of {got}; "
                                "it must return [B, m] = (2, 3) (B prompts, m responses each)")

    out = subprocess.run(cli_args(tmp_path / "run", toy_cache, kind="drm", **{"reward.kind": "wrong_shapes:short"}),
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == (
        "error: config.reward.kind='wrong_shapes:short': the plug-in returned rewards of shape (2,); it must "
        "return [B, m] = (4, 4) (B prompts, m responses each)")


def write_prompts(path, n):
    path.write_text("".join(json.dumps({"prompt": f"{i}{i}>"}) + "\n" for i in range(n)))
    return str(path)


def test_prompt_files_split_rules_and_disjoint_ids(tmp_path):
    config = base_config("drm")
    config.data.path = write_prompts(tmp_path / "small.jsonl", 5)
    with pytest.raises(ConfigError, match="has 5 usable prompts.*data.eval_path"):
        load_prompts(validate(config).prompts)
    config.data.eval_path = write_prompts(tmp_path / "eval.jsonl", 3)
    train, ev = load_prompts(validate(config).prompts)
    assert (train.ids, ev.ids) == ([0, 1, 2, 3, 4], [5, 6, 7])
    config.data.path, config.data.eval_path = write_prompts(tmp_path / "big.jsonl", 30), ""
    train, ev = load_prompts(validate(config).prompts)
    assert len(train.ids) == 27 and ev.ids == [27, 28, 29] and ev.texts == ["2727>", "2828>", "2929>"]
