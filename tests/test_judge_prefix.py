"""Shared-prefix prefill with a real (tiny, random) decoder: greedy judgments with reuse equal those without, the
prefill tokens drop to one prefill of each level of the question tree (the prompt's prefix, each response shown
first, each question), and the prefix / suffix split is exact for
tokenizers with and without a chat template (a split that a tokenizer merges falls back to a full prefill)."""

import numpy as np
import pytest
from flax import nnx

from rrc_jax.inference import make_sampler
from rrc_jax.judge import Judge, JudgeTemplate, get_template, render_parts
from rrc_jax.judge.templates import encode_question, encode_text, first_segment
from rrc_jax.models import Decoder, DecoderConfig, format_prompt, prompt_ids
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.sharding import model_context

CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def char_tokenizer(chat: bool):
    tok = make_char_tokenizer()
    if chat:
        tok.chat_template = CHAT
    return tok


def bpe_tokenizer():
    """A byte-level BPE with Llama 3's pre-tokenizer split, trained offline on judge-like text, with a chat
    template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = [t.system or "" for t in map(get_template, ("rrc_pairwise_cot", "rmr1_cor"))]
    corpus += ["[The Start of Response A]\nThe answer is 4.\n[The End of Response A]\n\nresponse responses " * 3]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT
    return fast


def tiny_decoder(vocab: int, seed: int = 0) -> Decoder:
    cfg = DecoderConfig(model_type="llama", vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=4096, bos_token_id=1,
                        eos_token_ids=(2,), pad_token_id=0)
    with model_context(None):
        model = Decoder(cfg, rngs=nnx.Rngs(seed))
    return model


PROMPTS = ["What is 2 + 2?", "Name a prime number larger than ten."]
GROUPS = [["4", "Four.", "It is 5."], ["11", "13 is prime.", "Twelve"]]


@pytest.mark.parametrize("tokenizer_kind", ["char", "char_chat", "bpe_chat"])
def test_split_is_exact(tokenizer_kind):
    tok = {"char": lambda: char_tokenizer(False), "char_chat": lambda: char_tokenizer(True), "bpe_chat": bpe_tokenizer}[
        tokenizer_kind]()
    for name in ("rrc_pairwise_cot", "rrc_pairwise_direct", "rmr1_cor", "toy_pairwise_cot"):
        t = get_template(name)
        for prompt, (a, b) in zip(PROMPTS, [GROUPS[0][:2], GROUPS[1][1:]]):
            pre, suf = render_parts(tok, t, prompt, a=a, b=b)
            user = t.context.replace("{prompt}", prompt) + t.item.replace("{a}", a).replace("{b}", b)
            assert pre + suf == format_prompt(tok, user, t.system)
            q = encode_question(tok, pre, suf)
            assert q.full == prompt_ids(tok, user, t.system)
            assert q.reusable and q.prefix + q.suffix == q.full, (name, prompt)


@pytest.mark.parametrize("chat", [False, True])
def test_texts_are_inserted_verbatim_whatever_they_hold(chat):
    """A response that reads like a placeholder (`{b}`), or holds the split marker, is shown to the judge as it is:
    never substituted by the other response, never a failed split."""
    from rrc_jax.judge.templates import _MARK
    tok, t = char_tokenizer(chat), get_template("rrc_pairwise_cot")
    for prompt, a, b in [("Q {a}", "{b}", "1234"), ("Q", "{response}{prompt}", "{a}"),
                         ("Q" + _MARK, "1168" + _MARK, _MARK + "1"), ("Q", "x", "{b}" + _MARK + "1\u241e")]:
        pre, suf = render_parts(tok, t, prompt, a=a, b=b)
        user = t.context.replace("{prompt}", prompt) + t.item.replace("{a}", "\0A\0").replace("{b}", "\0B\0")
        user = user.replace("\0A\0", a).replace("\0B\0", b)
        assert pre + suf == format_prompt(tok, user, t.system), (prompt, a, b)
        assert suf.count(a) >= 1 and suf.index(a) < suf.rindex(b)


def test_split_that_a_tokenizer_merges_is_detected():
    """A template whose context ends inside a word: BPE merges across the boundary, so it is not reusable."""
    tok = bpe_tokenizer()
    bad = JudgeTemplate("bad_split", "pairwise", None, "{prompt} resp", "onses: A {a} B {b}", think=True)
    pre, suf = render_parts(tok, bad, "Q", a="x", b="y")
    assert not encode_question(tok, pre, suf).reusable


# a short chat-style template keeps the random judge's outputs response-dependent (with the long instructions a
# tiny random model writes the same text for every pair, which would make the comparison vacuous)
SHORT = JudgeTemplate("short", "pairwise", "Judge the pair.", "Q: {prompt}\n\n", "[A] {a}\n[B] {b}\nVerdict:",
                      think=True)


@pytest.mark.parametrize("tokenizer_kind,template", [("char", "toy_pairwise_cot"), ("char_chat", SHORT),
                                                     ("bpe_chat", SHORT)])
def test_greedy_judgments_with_reuse_equal_without(tokenizer_kind, template):
    tok = {"char": lambda: char_tokenizer(False), "char_chat": lambda: char_tokenizer(True), "bpe_chat": bpe_tokenizer}[
        tokenizer_kind]()
    model = tiny_decoder(len(tok), seed=0)  # a seed whose random judge writes different texts for different pairs
    kw = dict(template=template, temperature=0.0, max_new_tokens=16)
    reuse = Judge(make_sampler("grm", model, tok, max_batch=16), tok, **kw)
    full = Judge(make_sampler("grm", model, tok, max_batch=16, prefix_reuse=False), tok, **kw)
    a = [g[i] for g in GROUPS for i in (0, 0, 1)]
    b = [g[j] for g in GROUPS for j in (1, 2, 2)]
    prompts = [p for p in PROMPTS for _ in range(3)]
    v1, log1 = reuse.explain(prompts, a, b, votes=2)
    v2, log2 = full.explain(prompts, a, b, votes=2)
    assert [v.text for v in log1] == [v.text for v in log2]
    assert len({v.text for v in log1}) > 1  # the random judge does not write the same thing for every pair
    for x, y in zip(v1, v2):
        np.testing.assert_array_equal(x, y)
    # each prompt has 3 pairs x 2 orders = 6 questions (one vote each), read as a prefix tree: the prefix once, each
    # response shown first once (2 questions each), then the rest of each question
    t = get_template(template)
    prefilled = 0
    for prompt, group in zip(PROMPTS, GROUPS):
        shown = [(group[i], group[j]) for i, j in ((0, 1), (0, 2), (1, 2))]
        shown += [(y, x) for x, y in shown]
        parts = [render_parts(tok, t, prompt, a=x, b=y) for x, y in shown]
        prefilled += len(encode_question(tok, *parts[0]).prefix)
        nodes = set()
        for part, (x, y) in zip(parts, shown):  # the first response's tokens, up to a token merged across its end
            suffix, lead = encode_question(tok, *part).suffix, encode_text(tok, first_segment(t, a=x, b=y), first=False)
            k = next((i for i, (u, v) in enumerate(zip(suffix, lead)) if u != v), min(len(suffix), len(lead)))
            nodes.add(tuple(suffix[:k]))
            prefilled += len(suffix) - k
        prefilled += sum(map(len, nodes))
    r, f = reuse.summary(), full.summary()
    assert r["prefill_tokens"] == prefilled
    assert r["prefill_tokens_saved"] == f["prefill_tokens"] - prefilled > 0
    assert r["reuse_fallbacks"] == 0 and r["questions"] == f["questions"] == 12


def test_fallback_questions_are_prefilled_in_full_and_counted():
    tok = bpe_tokenizer()
    model = tiny_decoder(len(tok), seed=4)
    bad = JudgeTemplate("bad_split", "pairwise", None, "{prompt} resp", "onses: A {a} B {b}\n", think=True)
    kw = dict(template=bad, temperature=0.0, max_new_tokens=16)
    reuse = Judge(make_sampler("grm", model, tok), tok, **kw)
    full = Judge(make_sampler("grm", model, tok, prefix_reuse=False), tok, **kw)
    _, log1 = reuse.explain(PROMPTS, ["4", "11"], ["5", "12"], votes=2)
    _, log2 = full.explain(PROMPTS, ["4", "11"], ["5", "12"], votes=2)
    assert [v.text for v in log1] == [v.text for v in log2]
    assert reuse.metrics.reuse_fallbacks == 4 and reuse.summary()["prefill_tokens_saved"] == 0
