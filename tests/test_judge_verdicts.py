"""Verdict and score parsing on realistic judge outputs: the final answer decides, nothing raises."""

import pytest

from rrc_jax.judge import parse_score, parse_verdict

COR_CHAT = """<type> Chat </type>
<rubric>
1. Empathy (weight 40%) 2. Actionable guidance (35%) 3. Safety (25%)
<justify>The client is distressed, so empathy and safety dominate.</justify>
</rubric>
<eval>
<quote_A>If you keep messing up, maybe it really isn't the right job for you.</quote_A>
<summary_B>Chatbot B validates the feelings and suggests talking to a mentor.</summary_B>
Chatbot B is better on every rubric item.
</eval>
<answer>[[B]]</answer>"""

COR_REASONING = """<type> Reasoning </type>
<solution>2 + 2 = 4</solution>
<eval>
<quote_A>The answer is 4.</quote_A> matches my solution. <quote_B>The answer is 5.</quote_B> is wrong.
</eval>
<answer>[[A]]</answer>"""

MT_BENCH = """Response A gives the correct result and explains each step, whereas Response B makes an arithmetic
slip in the second line and never recovers.

Final verdict: [[A]]"""

CASES = [
    # chain-of-rubrics transcripts
    (COR_CHAT, "B"),
    (COR_REASONING, "A"),
    # the rubric quotes the instruction "[[A]] or [[B]]" inside the reasoning; the answer tag still decides
    ("<eval>The format asks for [[A]] or [[B]]. A is wrong.</eval>\n<answer>[[B]]</answer>", "B"),
    (COR_CHAT.replace("<answer>[[B]]</answer>", "<answer>[[A]]</answer>\n\nI hope this evaluation helps!"), "A"),
    # several answer tags: the last one is the final answer
    ("<answer>[[A]]</answer> wait, let me re-check. <answer>[[B]]</answer>", "B"),
    # closing tag missing (stopped right after the verdict)
    ("<eval>B is more accurate.</eval>\n<answer>[[B]]", "B"),
    # bare letter inside the answer tag
    ("<answer> A </answer>", "A"),
    ("<answer>b</answer>", "B"),
    # plain final-line verdicts
    (MT_BENCH, "A"),
    ("Both are fluent, but B cites the source.\n[[B]]", "B"),
    ("[[A]]", "A"),
    ("[[B]]\n", "B"),
    ("Verdict: [[ A ]]", "A"),
    # lower case
    ("after weighing both, my verdict is [[a]]", "A"),
    ("<answer>[[b]]</answer>", "B"),
    # text after the verdict line
    ("Response B is shorter and correct.\n\n[[B]]\n\nNote: Response A was longer but contained an error.", "B"),
    ("[[A]]\nThis concludes the evaluation.", "A"),
    # the reasoning mentions an earlier verdict, the final line changes it
    ("At first glance [[A]] seems right.\nOn reflection the final verdict is [[B]]", "B"),
    # both verdicts in the final answer -> abstain
    ("<answer>[[A]] or [[B]]</answer>", None),
    ("<answer>[[A]]</answer><answer>[[A]][[B]]</answer>", None),
    ("Final verdict: [[A]] or [[B]]", None),
    ("Both are good: [[A]] [[b]]", None),
    # a tie verdict of the MT-bench style is not A or B
    ("They are equally good.\n[[C]]", None),
    ("<answer>[[C]]</answer>", None),
    # truncated before the verdict
    ("<type> Chat </type>\n<rubric>\n1. Accuracy (weight 50%)\n<justify>The question is factual", None),
    ("<eval>Chatbot A correctly states that", None),
    ("Let me compare the two responses step by step. Response A", None),
    # answer tag opened but truncated before the verdict
    ("<eval>A wins.</eval>\n<answer>", None),
    ("<eval>A wins.</eval>\n<answer>[[", None),
    # missing tags / malformed verdicts
    ("Response A is better.", None),
    ("The answer is A.", None),
    ("[A]", None),
    ("[[AB]]", None),
    ("<answer>Chatbot A</answer>", None),
    ("<answer></answer>", None),
    # empty / whitespace / not a string
    ("", None),
    ("   \n  ", None),
    (None, None),
    (42, None),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_parse_verdict(text, expected):
    assert parse_verdict(text) == expected


def test_enough_realistic_cases():
    assert len(CASES) >= 30


IRPO = """<critique>
The response answers the question directly and is factually accurate, but it ignores the requested bullet format.
</critique>

<score>
7.5
</score>"""

SCORE_CASES = [
    (IRPO, 7.5),
    ("<critique>Great.</critique><score>10.0</score>", 10.0),
    ("<score>8</score> Some trailing remark with 3 numbers 12.", 8.0),
    ("<score>6.0 / 10</score>", 6.0),
    ("<score>0.0</score>", 0.0),
    ("<score>3.5", 3.5),                               # closing tag missing
    ("<score>1.0</score> revised: <score>2.5</score>", 2.5),  # last block decides
    ("<SCORE> 9 </SCORE>", 9.0),
    ("7.3", 7.3),                                       # IRPO critique-to-score prompt: only a number
    ("-1", -1.0),                                       # IRPO's "invalid critique" answer, returned as written
    ("Overall score: 4.5", 4.5),
    ("<critique>The response is", None),               # truncated
    ("<score></score>", None),
    ("<score>excellent</score>", None),
    ("<score>nan</score>", None),
    ("no score here", None),
    ("", None),
    (None, None),
]


@pytest.mark.parametrize("text,expected", SCORE_CASES)
def test_parse_score(text, expected):
    got = parse_score(text)
    assert got == expected and (got is None or isinstance(got, float))


class Prose:
    """A judge that writes prose and never a verdict (a small instruct model), but whose next token after the
    verdict prefix prefers the response "999", wherever it is shown; records what it was asked to read."""

    def __init__(self, tokenizer):
        from rrc_jax.inference.sampler import SamplerStats

        self.tokenizer, self.stats, self.read = tokenizer, SamplerStats(), []
        self.context_length = None

    def complete(self, prefixes, suffixes, params, rng=0, *, streams=None, splits=None):
        import numpy as np

        from rrc_jax.inference.sampler import SampleOutput

        ids = self.tokenizer("Both answers have merits.", add_special_tokens=False).input_ids
        n = len(suffixes)
        tokens = np.tile(np.asarray(ids, np.int32), (n, 1))
        return SampleOutput(tokens, np.zeros(tokens.shape, np.float32), np.full(n, len(ids), np.int32),
                            np.ones(n, bool))

    def next_token_logprobs(self, prefixes, suffixes, token_ids, *, splits=None):
        import numpy as np

        texts = [self.tokenizer.decode(list(prefixes[p]) + list(s)) for p, s in suffixes]
        self.read += texts
        first = [t.index("999") < t.index("111") for t in texts]  # "999" shown as A
        return np.array([[0.0, -2.0] if a else [-2.0, 0.0] for a in first], np.float32).reshape(len(texts), 2)


@pytest.mark.parametrize("force", [False, True])
def test_forced_verdicts_read_a_judge_that_writes_none(force):
    """Without the option every judgment abstains; with it each is read after the verdict prefix, in both orders,
    counted as forced."""
    from rrc_jax.judge import Judge
    from rrc_jax.models.char_tokenizer import make_char_tokenizer

    tok = make_char_tokenizer()
    judge = Judge(Prose(tok), tok, template="toy_pairwise_cot", temperature=0.0, force_verdicts=force)
    judge.trace = []
    votes = judge.compare(["2+2", "3+3"], ["999", "111"], ["111", "999"], votes=2, swap=True)
    if not force:
        assert votes.abstains.tolist() == [2, 2] and judge.metrics.forced_verdicts == 0 and not judge.sampler.read
        return
    assert votes.wins.tolist() == [2, 0] and votes.losses.tolist() == [0, 2] and votes.abstains.sum() == 0
    assert judge.metrics.forced_verdicts == 4 and judge.metrics.abstains == 0
    assert all(t.endswith("Both answers have merits.\n[[") for t in judge.sampler.read)
    assert judge.summary()["position_consistency"] == 1.0 and all(r["forced"] for r in judge.trace)


def test_forced_verdicts_need_the_judge_in_this_process():
    from rrc_jax.config import base_config, validate
    from rrc_jax.errors import ConfigError

    c = base_config("scr")
    c.update_from_flattened_dict({"reward.judge.force_verdicts": True, "inference.engine": "openai",
                                  "inference.url": "http://127.0.0.1:9"})
    with pytest.raises(ConfigError, match="config.reward.judge.force_verdicts: .* inference.engine='openai'"):
        validate(c)
    c.inference.engine = "jax"
    assert validate(c).judge.force_verdicts
