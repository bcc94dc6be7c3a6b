"""The reward-model evaluator against scripted judges: accuracy, JudgeBench's both-orders rule, RM-Bench's
triangles, position consistency, abstentions, PRC buckets, pointwise scores, the DRM path, and the command line's
core on a tiny checkpoint.

`RuleSampler` implements the Sampler protocol by reading each question's text (the `toy_pairwise_cot` template:
"sort: PROMPT\\nA: TEXT\\nB: TEXT\\nthink:") and answering with `answer(prompt, a, b)`; its P(A) for PRC comes from
`prob(prompt, a, b)`. Chosen responses are written with "c", rejected ones with "r", so a rule can tell them apart.
"""

import dataclasses
import json
import math

import numpy as np
import pytest
from flax import nnx

from rrc_jax.models.batches import pad_sequences
from rrc_jax.data.preferences import Preference
from rrc_jax.judge import Judge, JudgeTemplate
from rrc_jax.models import Decoder, DecoderConfig
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.constructions.drm import DRMReward
from rrc_jax.rm.accuracy import (evaluate, judge_pairs, markdown_table, prc_buckets, rmbench_accuracy,
                                   score_correct, vote_counts)
from rrc_jax.rm.examples import scored_ids
from rrc_jax.sharding import model_context
from rrc_jax.testing import TextSampler

TOK = make_char_tokenizer()
POINTWISE = JudgeTemplate("toy_pointwise", "pointwise", None, "sort: {prompt}\n", "R: {response}\nscore:", think=True)


def fields(text: str) -> tuple[str, str, str]:
    """(prompt, A, B) of a pairwise question; (prompt, response, "") of a pointwise one."""
    prompt = text.split("sort: ")[1].split("\n")[0]
    if "\nR: " in text:
        return prompt, text.split("\nR: ")[1].split("\n")[0], ""
    return prompt, text.split("\nA: ")[1].split("\n")[0], text.split("\nB: ")[1].split("\n")[0]


def RuleSampler(answer, prob=None):
    """The package's text sampler (`rrc_jax.testing`) answering each question with `answer(prompt, a, b)` (P(A) =
    `prob(prompt, a, b)`)."""
    logprobs = None if prob is None else lambda text, ids: np.log([prob(*fields(text)), 1 - prob(*fields(text))])
    return TextSampler(TOK, lambda text: answer(*fields(text)), logprobs)


def judge_of(answer, prob=None, template="toy_pairwise_cot"):
    return Judge(RuleSampler(answer, prob), TOK, template=template, temperature=0.0, max_new_tokens=16)


def pick(winner_is_chosen: bool, a: str) -> str:
    """The verdict naming chosen (`winner_is_chosen`) or rejected, where `a` is the text shown as A."""
    a_is_chosen = a.startswith("c")
    return "[[A]]" if a_is_chosen == winner_is_chosen else "[[B]]"


def pref(prompt, chosen, rejected, **kw):
    return Preference(prompt, "c" + chosen, "r" + rejected, **kw)


# ------------------------------------------------------------------------------------------------------------
# Pairwise: accuracy, JudgeBench, position consistency, abstentions
# ------------------------------------------------------------------------------------------------------------

def test_judgebench_split_is_incorrect_while_accuracy_gives_it_half():
    """'fair' is judged right in both orders; 'bias' always gets "A": its orders split (1 vote each way)."""
    judge = judge_of(lambda p, a, b: "[[A]]" if p == "bias" else pick(True, a))
    prefs = [pref("fair", "1", "2"), pref("bias", "3", "4")]
    result, records = evaluate("pairwise", prefs, judge=judge)
    assert [r["correct"] for r in records] == [1.0, 0.5]
    assert [r["judgebench_correct"] for r in records] == [True, False]
    assert result["accuracy"] == 0.75 and result["judgebench_accuracy"] == 0.5
    assert result["position_consistency"] == 0.5  # both decided in both orders; 'bias' disagrees with itself
    assert records[1]["order1"] == {"chosen": 1, "rejected": 0, "abstain": 0}
    assert records[1]["order2"] == {"chosen": 0, "rejected": 1, "abstain": 0}
    assert [(j["order"], j["shown"], j["verdict"], j["winner"]) for j in records[1]["judgments"]] == [
        (1, "A = chosen, B = rejected", "A", "chosen"), (2, "A = rejected, B = chosen", "A", "rejected")]


@pytest.mark.parametrize("votes", [1, 2, 3])
def test_always_a_judge(votes):
    judge = judge_of(lambda p, a, b: "[[A]]")
    prefs = [pref(f"p{k}", "x" * k, "y") for k in range(4)]
    result, records = evaluate("pairwise", prefs, judge=judge, votes=votes)
    assert result["accuracy"] == 0.5 and result["judgebench_accuracy"] == 0.0
    assert result["position_consistency"] == 0.0 and result["abstain_rate"] == 0.0
    np.testing.assert_array_equal(vote_counts(records), [[[votes, 0, 0], [0, votes, 0]]] * 4)
    assert judge.sampler.stats.calls == 1 and judge.metrics.questions == 2 * 4 * votes  # one batched call
    assert all(len(r["judgments"]) == 2 * votes for r in records)
    assert result["judge_tokens_per_pair"] == 2 * votes * 6  # "[[A]]" + EOS per judgment


def test_abstentions_are_counted():
    """Order 1 is judged right, order 2 gets no verdict: accuracy and JudgeBench count it correct (one decided
    order), position consistency has no example decided in both orders, half the votes abstain."""
    judge = judge_of(lambda p, a, b: pick(True, a) if a.startswith("c") else "no idea")
    prefs = [pref("p", "1", "2"), pref("q", "3", "4")]
    result, records = evaluate("pairwise", prefs, judge=judge, votes=2)
    assert records[0]["order2"] == {"chosen": 0, "rejected": 0, "abstain": 2}
    assert result["accuracy"] == 1.0 and result["judgebench_accuracy"] == 1.0
    assert math.isnan(result["position_consistency"]) and result["abstain_rate"] == 0.5
    assert result["judge_tokens_per_pair"] == 2 * 6 + 2 * 8  # "[[A]]" / "no idea", each + EOS
    assert [j["verdict"] for j in records[0]["judgments"]] == ["A", "A", None, None]


def test_all_abstained_example_is_a_tie_and_not_judgebench_correct():
    judge = judge_of(lambda p, a, b: "hmm")
    result, _ = evaluate("pairwise", [pref("p", "1", "2")], judge=judge)
    assert result["accuracy"] == 0.5 and result["judgebench_accuracy"] == 0.0 and result["abstain_rate"] == 1.0


def test_chunks_give_the_same_records_and_report_progress():
    answer = lambda p, a, b: pick(len(a) > len(b), a)
    prefs = [pref(f"p{k}", "x" * k, "yy") for k in range(5)]
    whole = evaluate("pairwise", prefs, judge=judge_of(answer), votes=2)
    seen = []
    judge = judge_of(answer)
    parts = evaluate("pairwise", prefs, judge=judge, votes=2, chunk=2, progress=seen.append)
    assert seen == [2, 2, 1] and judge.sampler.stats.calls == 3
    assert parts == whole


# ------------------------------------------------------------------------------------------------------------
# RM-Bench
# ------------------------------------------------------------------------------------------------------------

def rmbench_row(key, chosen_lengths, rejected_lengths):
    """The 9 (chosen style i, rejected style j) pairs of one RM-Bench row; style s has the given text lengths."""
    return [Preference(f"q{key}", "c" * chosen_lengths[i], "r" * rejected_lengths[j], key=key, domain="chat",
                       style=(i, j)) for i in range(3) for j in range(3)]


def test_rmbench_triangles_of_a_judge_that_prefers_the_longer_response():
    """Row 'k1' (chosen lengths 4, 6, 9; rejected 3, 7, 5): right on the diagonal at (0, 0), (2, 2); above it only at
    (1, 2); below it everywhere: normal 2/3, hard 1/3, easy 1. Row 'k2': chosen always shorter: all 0."""
    judge = judge_of(lambda p, a, b: "[[A]]" if len(a) > len(b) else "[[B]]")
    prefs = rmbench_row("k1", [4, 6, 9], [3, 7, 5]) + rmbench_row("k2", [1, 1, 1], [5, 5, 5])
    prefs = prefs[::2] + prefs[1::2]  # rows interleaved: grouping goes by key, not position
    result, records = evaluate("pairwise", prefs, judge=judge)
    rm = result["rmbench"]
    assert rm == pytest.approx({"hard": 1 / 6, "normal": 1 / 3, "easy": 1 / 2, "overall": 1 / 3})
    assert result["accuracy"] == pytest.approx(1 / 3) and result["accuracy_by_domain"] == {"chat": result["accuracy"]}
    assert result["position_consistency"] == 1.0
    table = markdown_table(result)
    assert f"| rmbench/hard | {1 / 6:.4f} |" in table and "| accuracy_by_domain/chat |" in table


def test_rmbench_accuracy_needs_all_nine_cells():
    styles = [(i, j) for i in range(3) for j in range(3)]
    m = np.arange(9).reshape(3, 3) / 10
    assert rmbench_accuracy(m.ravel(), ["k"] * 9, styles) == pytest.approx(
        {"hard": (0.1 + 0.2 + 0.5) / 3, "normal": (0 + 0.4 + 0.8) / 3, "easy": (0.3 + 0.6 + 0.7) / 3, "overall": 0.4})
    with pytest.raises(ValueError, match=r"row 'k' .* missing \(2, 2\)"):
        rmbench_accuracy(m.ravel()[:8], ["k"] * 8, styles[:8])
    with pytest.raises(ValueError, match=r"repeated \(0, 0\)"):
        rmbench_accuracy(np.zeros(10), ["k"] * 10, styles + [(0, 0)])
    judge = judge_of(lambda p, a, b: "[[A]]")
    with pytest.raises(ValueError, match="whole RM-Bench rows"):
        evaluate("pairwise", rmbench_row("k", [1, 2, 3], [1, 2, 3])[:5], judge=judge)
    result, _ = evaluate("pairwise", rmbench_row("k", [1, 2, 3], [1, 2, 3])[:5] + [pref("p", "1", "2")], judge=judge)
    assert "rmbench" not in result  # not every example has a style: not RM-Bench data


# ------------------------------------------------------------------------------------------------------------
# PRC buckets
# ------------------------------------------------------------------------------------------------------------

def test_prc_buckets_on_given_probabilities():
    b = prc_buckets([0.0, 0.05, 0.1, 0.5, 0.9, 0.95, 1.0, 0.11])
    assert b == pytest.approx({"low": 3 / 8, "high": 3 / 8, "saturated": 6 / 8})


def test_prc_reads_p_chosen_in_both_orders():
    """'bias': P(A) = 0.95 whatever is shown (P(chosen) 0.95 then 0.05); 'fair': P(A) 0.6 with chosen as A, 0.3
    with chosen as B (P(chosen) 0.6, 0.7)."""
    prob = lambda p, a, b: 0.95 if p == "bias" else (0.6 if a.startswith("c") else 0.3)
    judge = judge_of(lambda p, a, b: "[[A]]", prob)
    result, records = evaluate("pairwise", [pref("bias", "1", "2"), pref("fair", "3", "4")], judge=judge, prc=True)
    np.testing.assert_allclose([r["p_chosen"] for r in records], [[0.95, 0.05], [0.6, 0.7]], rtol=1e-5)
    assert result["prc"] == pytest.approx({"low": 0.25, "high": 0.25, "saturated": 0.5, "accuracy": 0.75})
    assert result["judge_tokens_per_pair"] == 2 * 6  # the voting pass only, not PRC's reasoning
    with pytest.raises(ValueError, match="prc=True"):
        evaluate("pointwise", [pref("p", "1", "2")], judge=judge, prc=True)


# ------------------------------------------------------------------------------------------------------------
# Pointwise
# ------------------------------------------------------------------------------------------------------------

def test_pointwise_mean_scores_ties_and_abstentions():
    """Score = length of the response; a response containing "?" gets no score (NaN, a tie)."""
    judge = judge_of(lambda p, r, _: "no score" if "?" in r else f"<score>{len(r)}</score>", template=POINTWISE)
    prefs = [pref("a", "xxx", "y"), pref("b", "", "yy"), pref("c", "?", "y"), pref("d", "x", "y")]
    result, records = evaluate("pointwise", prefs, judge=judge, votes=2)
    assert [r["correct"] for r in records] == [1.0, 0.0, 0.5, 0.5]
    assert records[0]["scores_chosen"] == [4.0, 4.0] and records[2]["scores_chosen"] == [None, None]
    assert result["accuracy"] == 0.5 and result["abstain_rate"] == 2 / 16
    assert "judgebench_accuracy" not in result and "position_consistency" not in result
    assert judge.metrics.questions == 16 and judge.sampler.stats.calls == 1


def test_score_correct():
    np.testing.assert_array_equal(score_correct([1, 2, 3, np.nan], [0, 2, 4, 1]), [1, 0.5, 0, 0.5])


# ------------------------------------------------------------------------------------------------------------
# DRM
# ------------------------------------------------------------------------------------------------------------

def tiny_drm(value_head_seed=0):
    cfg = DecoderConfig(model_type="llama", vocab_size=len(TOK), hidden_size=16, intermediate_size=32, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=8, value_head=True, eos_token_ids=(2,), pad_token_id=0)
    with model_context(None):
        drm = Decoder(cfg, rngs=nnx.Rngs(0))
    drm.value_head.kernel.value = np.random.default_rng(value_head_seed).normal(size=16).astype(np.float32)
    return drm


def test_drm_accuracy_and_rmbench_from_its_own_values():
    drm = tiny_drm()
    prefs = rmbench_row("k", [2, 5, 8], [3, 4, 9])
    prefs = [dataclasses.replace(p, chosen=p.chosen.replace("c", "ab"), rejected=p.rejected.replace("r", "ba"))
             for p in prefs]
    result, records = evaluate("drm", prefs, drm=DRMReward(drm, TOK, max_batch=32))
    rows = [scored_ids(TOK, p.prompt, o) for p in prefs for o in (p.chosen, p.rejected)]
    ids, mask = pad_sequences(rows, max(map(len, rows)), 0, "right")
    s = np.asarray(drm.values(ids, mask)).reshape(9, 2)
    np.testing.assert_allclose([[r["score_chosen"], r["score_rejected"]] for r in records], s, rtol=1e-5, atol=1e-6)
    correct = np.array([r["correct"] for r in records])
    np.testing.assert_array_equal(correct, (s[:, 0] > s[:, 1]) + 0.5 * (s[:, 0] == s[:, 1]))
    m = correct.reshape(3, 3)
    assert result["accuracy"] == pytest.approx(correct.mean())
    assert result["rmbench"] == pytest.approx({"hard": m[np.triu_indices(3, 1)].mean(), "normal": np.diag(m).mean(),
                                               "easy": m[np.tril_indices(3, -1)].mean(), "overall": m.mean()})
    assert 0 < correct.sum() < 9  # the fixture is not degenerate
    same, _ = evaluate("drm", [Preference("p", "ab", "ab")], drm=DRMReward(drm, TOK))
    assert same["accuracy"] == 0.5  # equal scores: a tie
    assert set(result) == {"kind", "examples", "accuracy", "rmbench", "accuracy_by_domain"}


def test_evaluate_checks_its_arguments():
    with pytest.raises(ValueError, match="kind='drm' needs drm="):
        evaluate("drm", [pref("p", "1", "2")])
    with pytest.raises(ValueError, match="use one of pairwise, pointwise, drm"):
        evaluate("listwise", [pref("p", "1", "2")])
    with pytest.raises(ValueError, match="no examples"):
        evaluate("pairwise", [], judge=judge_of(lambda p, a, b: "[[A]]"))
    with pytest.raises(ValueError, match="pointwise template"):
        evaluate("pointwise", [pref("p", "1", "2")], judge=judge_of(lambda p, a, b: "[[A]]"))


def test_judge_pairs_keeps_each_judgment():
    judge = judge_of(lambda p, a, b: f"{a}>{b} [[A]]")
    (r,) = judge_pairs(judge, [pref("p", "1", "2")], votes=1)
    assert [j["text"] for j in r["judgments"]] == ["c1>r2 [[A]]", "r2>c1 [[A]]"]


# ------------------------------------------------------------------------------------------------------------
# The command line's core
# ------------------------------------------------------------------------------------------------------------

def test_cli_run_on_tiny_checkpoints(tmp_path, capsys):
    from rrc_jax.errors import ConfigError
    from rrc_jax.evaluate_rm import Args, run
    from rrc_jax.models import save_hf

    cfg = DecoderConfig(model_type="llama", vocab_size=len(TOK), hidden_size=16, intermediate_size=32, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=8, eos_token_ids=(2,), pad_token_id=0)
    with model_context(None):
        save_hf(Decoder(cfg, rngs=nnx.Rngs(3)), tmp_path / "judge", tokenizer=TOK)
    save_hf(tiny_drm(), tmp_path / "drm", tokenizer=TOK)
    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": "3 1 2", "chosen": "1 2 3", "rejected": "3 2 1"},
            {"prompt": "2 1", "chosen": "1 2", "rejected": "2 1", "domain": "sort"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, dump = tmp_path / "result.json", tmp_path / "verdicts.jsonl"
    # the random judge writes no verdict in 4 tokens: no score is reported, the dump says why
    with pytest.raises(ConfigError, match=r"all 4 judge votes abstained \(0 did not fit .*, 4 were cut at "
                                          r"--max_new_tokens=4, .*: no score to report") as e:
        run(Args(model=str(tmp_path / "judge"), data=str(data), format="pairs", template="toy_pairwise_cot",
                 max_new_tokens=4, out=str(out), dump=str(dump)))
    assert "\n" not in str(e.value) and capsys.readouterr().out == "" and not out.exists()
    lines = [json.loads(x) for x in dump.read_text().splitlines()]
    assert [x["chosen"] for x in lines] == ["1 2 3", "1 2"]
    assert all(len(x["judgments"]) == 2 and {j["order"] for j in x["judgments"]} == {1, 2} for x in lines)
    assert all(j["verdict"] is None for x in lines for j in x["judgments"])

    result, records = run(Args(model=str(tmp_path / "drm"), data=str(data), format="pairs", kind="drm",
                               out=str(out), dump=str(dump)))
    assert result["examples"] == 2 and len(records) == 2
    assert capsys.readouterr().out.startswith("| metric | value |\n| --- | --- |\n| kind | drm |\n")
    saved = json.loads(out.read_text())
    assert saved["accuracy"] == result["accuracy"] and saved["args"]["format"] == "pairs"
    lines = [json.loads(x) for x in dump.read_text().splitlines()]
    assert np.mean([x["correct"] for x in lines]) == result["accuracy"]
    drm = DRMReward(tiny_drm(), TOK)
    s = drm.scores([r["prompt"] for r in rows] * 2, [r["chosen"] for r in rows] + [r["rejected"] for r in rows])
    np.testing.assert_allclose([[r["score_chosen"], r["score_rejected"]] for r in records], s.reshape(2, 2).T,
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="no value head"):
        run(Args(model=str(tmp_path / "judge"), data=str(data), format="pairs", kind="drm"))
    with pytest.raises(ConfigError, match="--prc reads a pairwise judge"):
        run(Args(model=str(tmp_path / "drm"), data=str(data), format="pairs", kind="drm", prc=True))
