"""Judge engine throughput: judgments per second for SCR and AGR, with and without prefix reuse, against a plain
loop that calls transformers' `generate` once per judgment on the same weights.

    python benchmarks/judge.py [--prompts=2 --m=8 --n=8 --new_tokens=64 --baseline_pairs=8 --repeats=1]

A small Llama-style model with random weights is created with transformers, saved with `save_pretrained` and loaded
by `rrc_jax.models.load_hf`. Its tokenizer is a byte-level BPE (Llama 3's pre-tokenizer split) trained offline on
the judge instructions and the benchmark's vocabulary, so token counts are realistic (about one token per word).
The judge uses the real `rrc_pairwise_cot` template: the instruction and the prompt are shared by all pairs of a
prompt. Every judgment generates exactly `new_tokens` tokens (no stop token, greedy, fp32) on both sides, so the
work is equal: a random judge never writes a verdict, so every vote abstains, which does not change the cost.

Rows:
  scr_v1   round_robin, m responses, V = 1: m(m-1)/2 judgments per prompt
  scr_v4   round_robin, V = 4 (A/B swapped on half): 4 m(m-1)/2 per prompt
  agr_v1   vs_anchors, m responses x n anchors, V = 1
Each with `prefix_reuse` on and off; the baseline times `baseline_pairs` single-judgment `generate` calls on the same
full judge prompts and reports their rate. Timings are the best of `repeats` after one warm-up call (JAX
compilation excluded). Prints a table and writes benchmarks/results/judge.json.
"""

from __future__ import annotations

import json
import platform
import string
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import flags

from rrc_jax import cli


def build_checkpoint(path: Path, vocab: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model, sum(p.numel() for p in model.parameters())


WORDS = ["".join(np.random.default_rng(i).choice(list(string.ascii_lowercase), 2 + i % 6)) for i in range(300)]
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def random_text(rng, n: int) -> str:
    return " ".join(rng.choice(WORDS, n))


def bpe_tokenizer(vocab_size: int = 1024):
    """Byte-level BPE trained offline on the judge instructions and `WORDS`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rrc_jax.judge import TEMPLATES

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = [t.system or "" for t in TEMPLATES.values()] + [t.context + t.item for t in TEMPLATES.values()]
    corpus += [" ".join(WORDS)] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def best_of(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def define_flags() -> None:
    """The benchmark's flags (module docstring)."""
    flags.DEFINE_integer("prompts", 2, "Prompts judged per call.")
    flags.DEFINE_integer("m", 8, "Responses per prompt.")
    flags.DEFINE_integer("n", 8, "Anchors per prompt (AGR).")
    flags.DEFINE_integer("new_tokens", 128, "Tokens generated per judgment.")
    flags.DEFINE_integer("max_batch", 64, "Most rows per sampler call.")
    flags.DEFINE_integer("baseline_pairs", 8, "Judgments the transformers loop times (at most m - 1).")
    flags.DEFINE_integer("repeats", 1, "Timed calls per row (the best counts).")
    flags.DEFINE_string("out", str(Path(__file__).parent / "results" / "judge.json"), "JSON path.")


def run() -> None:
    """Time every workload with and without prefix reuse and the transformers loop; print the table, write the
    JSON (module docstring)."""
    args = flags.FLAGS
    cli.check_at_least(1, "prompts", "new_tokens", "max_batch", "baseline_pairs", "repeats", "n")
    cli.check_at_least(2, "m")

    import jax
    import torch

    from rrc_jax.inference import make_sampler
    from rrc_jax.judge import Judge, get_template, render_parts
    from rrc_jax.judge.templates import encode_question
    from rrc_jax.models import load_hf

    tok = bpe_tokenizer()
    tmp = Path(tempfile.mkdtemp())
    ref, n_params = build_checkpoint(tmp, len(tok))
    model = load_hf(tmp)
    rng = np.random.default_rng(0)
    prompts = [random_text(rng, 24) + "?" for _ in range(args.prompts)]
    responses = [[random_text(rng, 40) for _ in range(args.m)] for _ in prompts]
    anchors = [[random_text(rng, 40) for _ in range(args.n)] for _ in prompts]

    def judge(reuse: bool) -> Judge:
        sampler = make_sampler("grm", model, tok, max_batch=args.max_batch, prefix_reuse=reuse, stop_token_ids=())
        return Judge(sampler, tok, template="rrc_pairwise_cot", temperature=0.0, max_new_tokens=args.new_tokens)

    workloads = {
        "scr_v1": lambda j: j.round_robin(prompts, responses, votes=1),
        "scr_v4": lambda j: j.round_robin(prompts, responses, votes=4),
        "agr_v1": lambda j: j.vs_anchors(prompts, responses, anchors, votes=1),
    }
    rows = []
    for name, work in workloads.items():
        for reuse in (True, False):
            j = judge(reuse)
            work(j)  # compile
            j.reset_metrics()
            seconds, _ = best_of(lambda: work(j), args.repeats)
            s = j.summary()
            q = s["questions"] // args.repeats
            rows.append(dict(workload=name, prefix_reuse=reuse, judgments=q, seconds=seconds,
                             judgments_per_s=q / seconds, sampler_calls=s["sampler_calls"] // args.repeats,
                             prefill_tokens=s["prefill_tokens"] // args.repeats,
                             prefill_tokens_saved=s["prefill_tokens_saved"] // args.repeats))

    # baseline: one transformers generate call per judgment, on the same full judge prompts
    template = get_template("rrc_pairwise_cot")
    full = [encode_question(tok, *render_parts(tok, template, prompts[0], a=responses[0][0], b=responses[0][k + 1]))
            .full for k in range(min(args.baseline_pairs, args.m - 1))]

    def loop():
        with torch.no_grad():
            for ids in full:
                x = torch.tensor([ids])
                ref.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=args.new_tokens,
                             min_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)

    with torch.no_grad():  # warm-up: two full-length calls
        for _ in range(2):
            x = torch.tensor([full[0]])
            ref.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=args.new_tokens,
                         min_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    hf_seconds, _ = best_of(loop, args.repeats)
    hf_rate = len(full) / hf_seconds
    for r in rows:
        r["speedup_vs_hf_loop"] = r["judgments_per_s"] / hf_rate

    print(f"judge benchmark: {n_params / 1e6:.1f}M params, {args.prompts} prompts, m={args.m}, n={args.n}, "
          f"{args.new_tokens} new tokens per judgment, prompt ~{len(full[0])} tokens, "
          f"{jax.devices()[0].platform}")
    print(f"{'workload':8} {'reuse':>5} {'judgments':>9} {'calls':>5} {'prefill tok':>11} {'saved':>7} "
          f"{'seconds':>8} {'judg/s':>8} {'vs HF loop':>10}")
    for r in rows:
        print(f"{r['workload']:8} {str(r['prefix_reuse']):>5} {r['judgments']:9d} {r['sampler_calls']:5d} "
              f"{r['prefill_tokens']:11d} {r['prefill_tokens_saved']:7d} {r['seconds']:8.2f} "
              f"{r['judgments_per_s']:8.2f} {r['speedup_vs_hf_loop']:9.1f}x")
    print(f"{'hf loop':8} {'-':>5} {len(full):9d} {len(full):5d} {sum(map(len, full)):11d} {0:7d} "
          f"{hf_seconds:8.2f} {hf_rate:8.2f} {1.0:9.1f}x")
    result = dict(torch_threads=torch.get_num_threads(), params=n_params, prompts=args.prompts, m=args.m, n=args.n, new_tokens=args.new_tokens,
                  max_batch=args.max_batch, prompt_tokens=len(full[0]), platform=jax.devices()[0].platform,
                  machine=platform.machine(), hf_loop=dict(judgments=len(full), seconds=hf_seconds,
                                                           judgments_per_s=hf_rate), rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    define_flags()
    cli.start(cli.flags_main(run))
