"""Bad rows never crash-loop: prompts too long for the models are dropped at load and counted
(rows named in the log); a judge question too long for the judge's context is an abstention on every path (the
prefix-reuse path of a real tiny decoder included), never generated; a malformed JSON line names file and line and,
with `data.skip_bad_rows`, is skipped and counted."""

import gzip
import json
import math

import numpy as np
import pytest
from flax import nnx

from rrc_jax.config import base_config, validate
from rrc_jax.constructions import construction_class
from rrc_jax.data.prompts import load_prompts, prompt_token_limit, prompt_tokens
from rrc_jax.errors import ConfigError
from rrc_jax.inference import SampleOutput, SamplerStats, make_sampler
from rrc_jax.judge import Judge, get_template, render_parts
from rrc_jax.models import Decoder, DecoderConfig
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.sharding import model_context

CONTEXT = 256
LONG = "9 " * 150  # 300 characters: 300+ tokens of the character tokenizer
SHORT = "3 1 2"


def write_jsonl(path, lines: list[str]):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    return path


def file_config(path, **data):
    config = base_config("scr")
    with config.unlocked():
        config.data.update(dict(path=str(path), field="prompt", eval_prompts=0, **data))
    return config


# ------------------------------------------------------------------------------------------------------------
# Prompts too long for the models
# ------------------------------------------------------------------------------------------------------------


def test_long_prompt_is_dropped_and_counted(tmp_path, capsys):
    tok = make_char_tokenizer()
    rows = [f"{k} 2 1" for k in range(12)]
    rows[7] = LONG
    config = file_config(write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": r}) for r in rows]))
    limit = prompt_token_limit(config.data.max_prompt_tokens, config.rl.max_new_tokens,
                               policy_context=CONTEXT)  # a 256-token policy: 256 - rl.max_new_tokens
    assert limit == CONTEXT - config.rl.max_new_tokens
    assert len(prompt_tokens(tok, load_prompts(validate(config).prompts)[0], LONG)) > CONTEXT
    train, held = load_prompts(validate(config).prompts, tok, max_tokens=limit)
    assert LONG not in train.texts and len(train.texts) == 11 and not held.texts
    assert train.counts["dropped_long"] == 1 and 7 not in train.ids and train.rows == [r for r in range(12) if r != 7]
    assert f"dropped 1 training prompts of {tmp_path / 'p.jsonl'} longer than {limit} tokens (rows 7)" in (
        capsys.readouterr().err)
    # every prompt too long: one line
    config = file_config(write_jsonl(tmp_path / "all.jsonl", [json.dumps({"prompt": LONG})] * 3))
    with pytest.raises(ConfigError, match=r"all 3 training prompts .* longer than 244 tokens") as e:
        load_prompts(validate(config).prompts, tok, max_tokens=limit)
    assert "\n" not in str(e.value)


def test_limit_leaves_the_judge_room_for_its_question():
    """With a judge, a prompt leaves room for two responses, the template and the judgment."""
    config = base_config("scr")
    tok = make_char_tokenizer()
    rl, j = config.rl, config.reward.judge
    budget = (config.data.max_prompt_tokens, rl.max_new_tokens)
    with_judge = prompt_token_limit(*budget, CONTEXT, j, CONTEXT, tok)
    template = len(tok("".join(render_parts(tok, get_template(j.template), "", a="", b="")))["input_ids"])
    assert with_judge <= CONTEXT - j.max_new_tokens - 2 * rl.max_new_tokens - template
    assert with_judge < prompt_token_limit(*budget, CONTEXT)
    with pytest.raises(ConfigError, match="no room for a prompt"):
        prompt_token_limit(*budget, CONTEXT, j, 60, tok)


def test_long_judge_questions_are_dropped_with_their_oracle(tmp_path, capsys):
    """Judge-question sets (`data.format`): the long preference's question goes, every kept question's oracle still
    answers for that question; IRPO's pointwise questions go by pairs."""
    tok = make_char_tokenizer()
    rows = [{"prompt": f"{k} 1", "chosen": f"good{k}", "rejected": f"bad{k}"} for k in range(12)]
    rows[2]["prompt"] = LONG
    path = write_jsonl(tmp_path / "prefs.jsonl", [json.dumps(r) for r in rows])
    config = file_config(path, format="pairs")
    config.reward.kind, config.reward.judge.template = "rlvr", "toy_pairwise_cot"  # a kind that scores judge questions
    train, _ = load_prompts(validate(config).prompts, tok, max_tokens=200)
    assert len(train.texts) == 11 and train.counts["dropped_long"] == 1 and 2 not in train.rows
    for i, (text, row) in enumerate(zip(train.texts, train.rows)):
        chosen_first = text.index(f"good{row}") < text.index(f"bad{row}")
        assert train.oracle(i, "[[A]]" if chosen_first else "[[B]]") == 1.0, i
    assert "longer than 200 tokens (rows 2)" in capsys.readouterr().err
    config.reward.kind = "irpo"
    config.reward.judge.template = "toy_pointwise"
    train, _ = load_prompts(validate(config).prompts, tok, max_tokens=200, questions=construction_class("irpo").questions)
    assert train.paired and len(train.texts) == 22 and train.counts["dropped_long"] == 2
    assert train.rows == [r for r in range(12) if r != 2 for _ in range(2)]


# ------------------------------------------------------------------------------------------------------------
# Judge questions too long for the judge's context: a real tiny decoder, prefix reuse on
# ------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    tok = make_char_tokenizer()
    cfg = DecoderConfig(model_type="llama", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=CONTEXT, bos_token_id=1,
                        eos_token_ids=(2,), pad_token_id=0)
    with model_context(None):
        model = Decoder(cfg, rngs=nnx.Rngs(0))
    return model, tok


def judge_of(tiny, template="toy_pairwise_cot"):
    model, tok = tiny
    judge = Judge(make_sampler("grm", model, tok, max_batch=8), tok, template=template, temperature=0.0, max_new_tokens=8)
    assert judge.context_length == CONTEXT and judge.sampler.prefix_reuse
    return judge


def test_long_pairwise_question_is_an_abstention_on_the_prefix_reuse_path(tiny):
    judge, alone = judge_of(tiny), judge_of(tiny)
    judge.trace = []
    votes, log = judge.explain([LONG, SHORT, LONG], ["1 2 3"] * 3, ["3 2 1"] * 3, votes=2)
    want, want_log = alone.explain([SHORT], ["1 2 3"], ["3 2 1"], votes=2)
    np.testing.assert_array_equal(votes.abstains, [2, want.abstains[0], 2])
    assert (votes.wins[[0, 2]] == 0).all() and (votes.losses[[0, 2]] == 0).all()
    assert (votes.wins[1], votes.losses[1]) == (want.wins[0], want.losses[0])
    assert [v.text for v in log[2:4]] == [v.text for v in want_log] and {v.text for v in log[:2] + log[4:]} == {""}
    m = judge.metrics
    assert m.too_long == 4 and m.abstains == 4 + alone.metrics.abstains and m.questions == 6
    assert m.reuse_fallbacks == 0  # the prefix-reuse path: the questions split at their prompt's prefix
    # never generated: the sampler saw exactly the short pair's questions
    s, a = judge.sampler.stats, alone.sampler.stats
    assert (s.calls, s.prefill_tokens, s.generated_tokens) == (a.calls, a.prefill_tokens, a.generated_tokens)
    assert [r.get("too_long", False) for r in judge.trace] == [True, True, False, False, True, True]
    assert all(r["text"] == "" and r["verdict"] is None and r["winner"] is None for r in judge.trace if "too_long" in r)
    assert judge.compare([LONG], ["1"], ["2"], votes=3).abstains.tolist() == [3]  # none left: still a (void) call
    assert judge.sampler.stats.generated_tokens == a.generated_tokens


@pytest.mark.parametrize("think", [True, False])
def test_long_prc_question_is_one_half(tiny, think):
    judge, alone = judge_of(tiny), judge_of(tiny)
    judge.trace = []
    p = judge.preference_prob([SHORT, LONG, SHORT], ["1 2 3", "1 2 3", "2 1 3"], ["3 2 1"] * 3, think=think)
    want = alone.preference_prob([SHORT, SHORT], ["1 2 3", "2 1 3"], ["3 2 1"] * 2, think=think)
    assert p[1] == 0.5
    np.testing.assert_allclose(p[[0, 2]], want, rtol=1e-5)
    assert judge.metrics.too_long == 1 and judge.metrics.abstains == 1
    assert judge.sampler.stats.prefill_tokens == alone.sampler.stats.prefill_tokens
    assert [r.get("too_long", False) for r in judge.trace] == [False, True, False]


def test_long_pointwise_question_is_nan(tiny):
    judge, alone = judge_of(tiny, "toy_pointwise"), judge_of(tiny, "toy_pointwise")
    judge.trace = []
    scores = judge.score([SHORT, LONG], [["1 2 3", "3 2 1"]] * 2, template="toy_pointwise")
    want = alone.score([SHORT], [["1 2 3", "3 2 1"]], template="toy_pointwise")
    assert np.isnan(scores[1]).all()
    np.testing.assert_array_equal(scores[0], want[0])  # NaN where the random judge wrote no score, alike
    assert judge.metrics.too_long == 2 and judge.metrics.abstains == 2 + alone.metrics.abstains
    assert judge.sampler.stats.generated_tokens == alone.sampler.stats.generated_tokens
    assert [r["text"] for r in judge.trace[2:]] == ["", ""] and all(r["too_long"] for r in judge.trace[2:])


def test_context_boundary_and_the_prc_read(tiny):
    """A question fits when its tokens plus max_new_tokens equal the context, not one more; a PRC question whose
    reasoning, read again with the verdict prefix, no longer fits is 0.5 without a read. A sampler says its context
    with `context_length`."""
    model, tok = tiny
    judge = judge_of(tiny)
    q = judge._questions(judge.template, [SHORT], [0], [{"a": "1 2 3", "b": "3 2 1"}], 8)
    n = len(q.prefixes[0]) + len(q.suffixes[0][1])
    for context, too_long in ((n + 8, False), (n + 7, True)):
        judge.context_length = context
        assert judge._questions(judge.template, [SHORT], [0], [{"a": "1 2 3", "b": "3 2 1"}], 8).too_long[0] == (
            too_long)

    class Rambling:
        """Writes max_new_tokens of reasoning without a verdict; records what it is asked to read."""

        def __init__(self, context_length):
            self.context_length, self.stats, self.reads = context_length, SamplerStats(), []

        def complete(self, prefixes, suffixes, params, rng=0, **_):
            x = tok("X", add_special_tokens=False)["input_ids"][0]
            k, t = len(suffixes), params.max_new_tokens
            return SampleOutput(np.full((k, t), x, np.int32), np.zeros((k, t), np.float32), np.full(k, t, np.int32),
                                np.ones(k, bool))

        def next_token_logprobs(self, prefixes, suffixes, token_ids, **_):
            self.reads.append(len(suffixes))
            return np.zeros((len(suffixes), len(token_ids)), np.float32)

    judge = Judge(Rambling(n + 8), tok, template="toy_pairwise_cot", max_new_tokens=8)
    assert judge.context_length == n + 8
    p = judge.preference_prob([SHORT], ["1 2 3"], ["3 2 1"], think=True)
    assert p[0] == 0.5 and judge.sampler.reads == [0]
    assert (judge.metrics.too_long, judge.metrics.abstains, judge.metrics.forced_verdicts) == (1, 1, 1)
    judge = Judge(Rambling(n + 64), tok, template="toy_pairwise_cot", max_new_tokens=8)
    assert judge.preference_prob([SHORT], ["1 2 3"], ["3 2 1"], think=True)[0] == 0.5  # read: logits equal
    assert judge.sampler.reads == [1] and judge.metrics.too_long == 0
    assert math.isnan(judge.summary()["position_consistency"])


# ------------------------------------------------------------------------------------------------------------
# Malformed JSON lines
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["p.jsonl", "p.jsonl.gz"])
def test_malformed_json_line_names_file_and_line_and_can_be_skipped(tmp_path, name, capsys):
    lines = [json.dumps({"prompt": f"{k} 2 1"}) for k in range(12)]
    lines[2] = '{"prompt": "4 3 1"'   # line 3: cut short
    lines[8] = '["not", "a row"]'     # line 9: not an object
    config = file_config(write_jsonl(tmp_path / name, lines))
    with pytest.raises(ConfigError, match=rf"{name}:3: malformed JSON line .*skip_bad_rows") as e:
        load_prompts(validate(config).prompts)
    assert "\n" not in str(e.value)
    with config.unlocked():
        config.data["skip_bad_rows"] = True
    train, _ = load_prompts(validate(config).prompts)
    assert train.texts == [f"{k} 2 1" for k in range(12) if k not in (2, 8)]
    assert train.counts["bad_rows_skipped"] == 2
    err = capsys.readouterr().err
    assert f"skipped 2 malformed JSON lines of {name}" in err and f"{name}:3:" in err and f"{name}:9:" in err


def test_malformed_json_document_names_its_line(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('[{"prompt": "a"},\n {"prompt": "b"\n]\n')
    with pytest.raises(ConfigError, match=r"p.json:3: malformed JSON"):
        load_prompts(validate(file_config(path)).prompts)
