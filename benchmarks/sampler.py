"""Decode throughput of `rrc_jax.inference.kernels.generate` vs transformers' `generate` on the same weights.

    python benchmarks/sampler.py [--batch_sizes=1,8,64 --new_tokens=128 --prompt_len=32 --repeats=3 --rounds=2
                                  --dtype=float32]

A ~20M-parameter Llama-style model with random weights is created with transformers, saved with
`save_pretrained`, and loaded by `rrc_jax.models.load_hf`; both sides then generate the same number of tokens
per row (no stop token), greedy, in `--dtype` (float32, the default, or bfloat16 weights and compute on both
sides), on the CPU (or whatever JAX / torch default to). Tokens/s counts generated tokens (batch x new tokens) over
wall time of the whole call (prefill included), after one warm-up call (JAX compilation excluded), best of
`--repeats` calls. Each batch size is measured in `--rounds` rounds (ours, then transformers, then again), so that
a slow spell of a shared machine does not fall on one side only; the table gives the best time of each side over
all rounds and the range of the per-round speedups. Prints a table and writes benchmarks/results/sampler.json
(sampler_bfloat16.json for bfloat16).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import flags

from rrc_jax import cli


def build_checkpoint(path: Path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=8192, hidden_size=384, intermediate_size=1024, num_hidden_layers=8,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model, sum(p.numel() for p in model.parameters())


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def define_flags() -> None:
    """The benchmark's flags (module docstring)."""
    flags.DEFINE_string("batch_sizes", "1,8,64", "Batch sizes to measure, comma-separated.")
    flags.DEFINE_integer("new_tokens", 128, "Tokens generated per row.")
    flags.DEFINE_integer("prompt_len", 32, "Prompt tokens per row.")
    flags.DEFINE_integer("repeats", 3, "Timed calls per round and side (the best counts).")
    flags.DEFINE_integer("rounds", 2, "Rounds per batch size (ours, then transformers).")
    cli.dtype_flag("float32", "Weight and compute dtype of both sides.")
    flags.DEFINE_string("out", None, "JSON path (default: benchmarks/results/sampler[_bfloat16].json).")


def batch_sizes(text: str) -> list[int]:
    """'1,8,64' -> [1, 8, 64]; a `flag_error` unless every size is a positive integer."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise cli.flag_error("batch_sizes", "give positive integers separated by commas, e.g. 1,8,64")
    return sizes


def run() -> None:
    """Measure both sides at every batch size, print the table, write the JSON (module docstring)."""
    args = flags.FLAGS
    cli.check_at_least(1, "new_tokens", "prompt_len", "repeats", "rounds")
    sizes = batch_sizes(args.batch_sizes)

    import jax
    import torch

    from rrc_jax.models import load_hf
    from rrc_jax.inference.kernels import SamplingParams, generate

    tmp = Path(tempfile.mkdtemp())
    ref, n_params = build_checkpoint(tmp)
    ref = ref.to(getattr(torch, args.dtype))
    model = load_hf(tmp, dtype=args.dtype)
    rng = np.random.default_rng(0)
    rows = []
    for b in sizes:
        ids = rng.integers(3, 8192, (b, args.prompt_len))
        prompts = ids.tolist()

        def ours():
            generate(model, prompts, SamplingParams(0.0, max_new_tokens=args.new_tokens, stop_token_ids=()))

        def theirs():
            with torch.no_grad():
                ref.generate(input_ids=torch.tensor(ids), attention_mask=torch.ones_like(torch.tensor(ids)),
                             max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)

        ours()  # compile
        theirs()
        rounds = [(best_of(ours, args.repeats), best_of(theirs, args.repeats)) for _ in range(args.rounds)]
        t_ours, t_hf = min(r[0] for r in rounds), min(r[1] for r in rounds)
        tokens = b * args.new_tokens
        rows.append(dict(batch=b, new_tokens=args.new_tokens, rrc_jax_tok_s=tokens / t_ours,
                         transformers_tok_s=tokens / t_hf, speedup=t_hf / t_ours,
                         round_speedups=[hf / o for o, hf in rounds], target=3.0 if b <= 8 else 1.5))
        print(f"batch {b}: done", flush=True)

    print(f"\nmodel: Llama-style, {n_params / 1e6:.1f}M params, {args.dtype}; prompt {args.prompt_len} tokens, "
          f"{args.new_tokens} new tokens; jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} "
          f"({torch.get_num_threads()} threads)")
    print(f"{'batch':>5} {'rrc_jax tok/s':>14} {'transformers tok/s':>19} {'speedup':>8} {'per round':>13} "
          f"{'target':>7}")
    for r in rows:
        spread = f"{min(r['round_speedups']):.2f}-{max(r['round_speedups']):.2f}x"
        print(f"{r['batch']:>5} {r['rrc_jax_tok_s']:>14.1f} {r['transformers_tok_s']:>19.1f} "
              f"{r['speedup']:>7.2f}x {spread:>13} {r['target']:>6.1f}x")
    suffix = "" if args.dtype == "float32" else f"_{args.dtype}"
    out = Path(args.out or Path(__file__).parent / "results" / f"sampler{suffix}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(params=n_params, dtype=args.dtype, prompt_len=args.prompt_len,
                                   repeats=args.repeats, rounds=args.rounds, jax=jax.__version__,
                                   backend=jax.default_backend(), torch=torch.__version__,
                                   machine=platform.machine(), cpus=os.cpu_count(), rows=rows), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    define_flags()
    cli.start(cli.flags_main(run))
