"""Accelerator figures for a ~1B-parameter Llama (Llama-3.2-1B shape, random weights), one part per process.

    python benchmarks/device.py --part=sampler      --ckpt_dir=DIR [--dry_run]  # writes DIR first, then times
    python benchmarks/device.py --part=transformers --ckpt_dir=DIR [--dry_run]  # reads DIR
    python benchmarks/device.py --part=learner                     [--dry_run]

`benchmarks/device.sh` runs the three parts in turn (each in its own process, so JAX and torch never share the
accelerator's memory or CUDA libraries) and is the way to use this file.

- sampler: a bfloat16 `rrc_jax.models.decoder.Decoder` (vocab 128256, hidden 2048, MLP 8192, 16 layers, 32 heads,
  8 kv heads, head_dim 64, tied embeddings, llama3 RoPE) with random weights is saved with
  `rrc_jax.models.save_hf` to `--ckpt_dir`; then `rrc_jax.inference.engine.JaxSampler.generate` samples
  `--prompts` random prompts of `--prompt_len` tokens x `--group` responses x `--new_tokens` new tokens
  (temperature 1, no stop token, so every row has exactly `--new_tokens`). Prints generated tokens/s: the best of
  `--repeats` calls after a warm-up call (compilation excluded; prefill included).
- transformers: the same checkpoint in `LlamaForCausalLM` (torch, bfloat16, CUDA when there is one), `generate`
  of the same prompts and lengths (`num_return_sequences=--group`, `do_sample=True`, top-k off,
  `min_new_tokens=max_new_tokens`). Same timing.
- learner: one `rrc_jax.rl.learner.Learner` update (AdamW, `make_optimizer`) of the GRPO loss
  (`rrc_jax.rl.grpo.grpo_objective`) on `--batch` rows x `--seq_len` tokens (the last `--seq_len - --prompt_part`
  positions are the response; micro-batches of `--micro_batch` rows, halved on an out-of-memory error), float32
  master weights and bfloat16 compute (`DecoderConfig(dtype='bfloat16', param_dtype='float32')`); about 70 GB of
  accelerator memory at the defaults (XLA's CPU compilation of the same step: 53 GB of temporaries, 15 GB of
  parameters and optimizer state). Prints the best step time of `--learner_steps` after a
  warm-up step and the model FLOP utilization `6 * params * tokens / time / peak` (tokens = batch x seq_len; the
  attention's own FLOPs are not counted), against `--peak_tflops` (env PEAK_TFLOPS; default 989, the H200's dense
  bfloat16 peak).

`--dry_run` (or DRY_RUN=1) runs the same code on the CPU with a tiny model (hidden 64, 2 layers, vocab 256) and a
few tokens, in seconds. Each part prints one `RESULT {json}` line and, with `--out_dir`, writes
`device_<part>.json` there.

Imports only what the parts need: absl (its flags, through `rrc_jax.cli`), jax, flax, optax, numpy, safetensors and
etils (through `rrc_jax.models`), and torch + transformers for the transformers part; not grain or ml_collections.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from absl import flags

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's rrc_jax, also uninstalled
from rrc_jax import cli  # noqa: E402

PARTS = ("sampler", "transformers", "learner")

# Llama-3.2-1B's architecture.
FULL_MODEL = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                  num_kv_heads=8, head_dim=64, max_position_embeddings=131072)
DRY_MODEL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=16, max_position_embeddings=131072)
FULL_SIZES = dict(prompts=32, group=8, prompt_len=64, new_tokens=256, repeats=3, batch=64, seq_len=1024,
                  prompt_part=256, micro_batch=4, learner_steps=3)
DRY_SIZES = dict(prompts=4, group=2, prompt_len=8, new_tokens=8, repeats=2, batch=4, seq_len=32, prompt_part=8,
                 micro_batch=2, learner_steps=2)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def define_flags() -> None:
    """The benchmark's flags (module docstring); a size flag left unset takes its FULL_SIZES value (DRY_SIZES with
    `--dry_run`)."""
    flags.DEFINE_enum("part", None, PARTS, "The part to run, in this process.")
    flags.mark_flag_as_required("part")
    flags.DEFINE_boolean("dry_run", env_flag("DRY_RUN"), "Tiny model on the CPU (also DRY_RUN=1).")
    flags.DEFINE_string("ckpt_dir", None, "The Hugging Face checkpoint (sampler writes, transformers reads).")
    flags.DEFINE_string("out_dir", None, "Write device_<part>.json here.")
    flags.DEFINE_float("peak_tflops", float(os.environ.get("PEAK_TFLOPS", 989.0)),
                       "The accelerator's dense bfloat16 peak for the MFU (env PEAK_TFLOPS; default H200: 989).")
    flags.DEFINE_integer("seed", 0, "PRNG seed.")
    for name, value in FULL_SIZES.items():
        flags.DEFINE_integer(name, None, f"Default {value} ({DRY_SIZES[name]} with --dry_run).")


def settled_flags():
    """`flags.FLAGS` with every size flag left unset set to its FULL or DRY size, checked: a mistake is one
    `error:` line (`cli.flag_error`)."""
    args = flags.FLAGS
    sizes = DRY_SIZES if args.dry_run else FULL_SIZES
    for name, value in sizes.items():
        if args[name].value is None:
            setattr(args, name, value)
    cli.check_at_least(1, *FULL_SIZES)
    if args.part in ("sampler", "transformers") and not args.ckpt_dir:
        raise cli.flag_error("part", "needs --ckpt_dir")
    if args.batch % args.micro_batch:
        raise cli.flag_error("micro_batch", f"must divide --batch={args.batch}")
    if not 0 < args.prompt_part < args.seq_len:
        raise cli.flag_error("prompt_part", f"must be above 0 and below --seq_len={args.seq_len}")
    return args


def model_config(args, **numerics):
    from rrc_jax.models.decoder_config import DecoderConfig

    shape = DRY_MODEL if args.dry_run else FULL_MODEL
    return DecoderConfig(model_type="llama", **shape, rms_norm_eps=1e-5, rope_theta=500000.0, rope_type="llama3",
                         rope_scaling=(("factor", 32.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                                       ("original_max_position_embeddings", 8192.0)),
                         tie_word_embeddings=True, eos_token_ids=(), pad_token_id=None, **numerics)


def prompts(args) -> list[list[int]]:
    import numpy as np

    vocab = (DRY_MODEL if args.dry_run else FULL_MODEL)["vocab_size"]
    return np.random.default_rng(args.seed).integers(3, vocab, (args.prompts, args.prompt_len)).tolist()


def count_params(model) -> int:
    import jax
    from flax import nnx

    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def build(cfg, seed: int):
    """A `Decoder` with random weights, built as the trainer builds its policy: on a (1, 1, 1) mesh, its parameters
    placed by the logical rules (committed arrays, so the first jitted update's outputs do not change the next
    call's input shardings and compile it again)."""
    from flax import nnx

    from rrc_jax.models.decoder import Decoder
    from rrc_jax.sharding import make_mesh, model_context

    mesh = make_mesh(1, 1, 1)
    with model_context(mesh):
        return Decoder(cfg, rngs=nnx.Rngs(seed)), mesh


def timed(fn, repeats: int) -> tuple[float, list[float], object]:
    """(warm-up seconds, the timed calls' seconds, the last result)."""
    t = time.perf_counter()
    out = fn()
    warmup = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return warmup, times, out


def jax_backend() -> str:
    import jax

    d = jax.devices()[0]
    return f"jax {jax.__version__} on {jax.device_count()} x {d.platform} ({getattr(d, 'device_kind', '?')})"


def peak_memory() -> int | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


# -- parts -------------------------------------------------------------------------------------------------------

def part_sampler(args) -> dict:
    import jax

    from rrc_jax.inference import make_sampler
    from rrc_jax.inference.sampler import SamplingParams
    from rrc_jax.models import save_hf

    print(f"sampler: {jax_backend()}", flush=True)
    t = time.perf_counter()
    model, mesh = build(model_config(args, dtype="bfloat16", param_dtype="bfloat16"), args.seed)
    n_params = count_params(model)
    save_hf(model, args.ckpt_dir)
    print(f"sampler: {n_params / 1e9:.3f}B params, bfloat16, saved to {args.ckpt_dir} in "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    rows = args.prompts * args.group
    sampler = make_sampler("policy", model, max_batch=rows)  # one chunk: every group in one call
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, stop_token_ids=())
    ids = prompts(args)
    calls = iter(range(1 << 30))
    with jax.set_mesh(mesh):
        warmup, times, out = timed(lambda: sampler.generate(ids, args.group, params, rng=next(calls)), args.repeats)
    tokens = int(out.lengths.sum())
    if tokens != rows * args.new_tokens:
        raise RuntimeError(f"generated {tokens} tokens, expected {rows} x {args.new_tokens}")
    best = min(times)
    print(f"rrc_jax sampler: {tokens / best:.1f} tokens/s ({args.prompts} prompts x {args.group} x "
          f"{args.new_tokens} new tokens, prompt {args.prompt_len}; best {best:.3f} s of {len(times)}, "
          f"warm-up {warmup:.1f} s)", flush=True)
    return dict(params=n_params, rows=rows, tokens=tokens, best_s=best, times_s=times, warmup_s=warmup,
                tokens_per_s=tokens / best, backend=jax_backend(), peak_bytes=peak_memory())


def part_transformers(args) -> dict:
    try:
        import torch
        from transformers import LlamaForCausalLM
    except ImportError as e:
        print(f"transformers generate: skipped ({e})", flush=True)
        return dict(skipped=str(e))
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    import transformers

    print(f"transformers: torch {torch.__version__}, transformers {transformers.__version__} on {device} ({name})",
          flush=True)
    model = LlamaForCausalLM.from_pretrained(args.ckpt_dir).to(device=device, dtype=torch.bfloat16).eval()
    n_params = sum(p.numel() for p in model.parameters())
    torch.manual_seed(args.seed)
    ids = torch.tensor(prompts(args), device=device)
    n = args.new_tokens

    def call():
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n, min_new_tokens=n,
                                 num_return_sequences=args.group, pad_token_id=0)
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    warmup, times, out = timed(call, args.repeats)
    rows = args.prompts * args.group
    if tuple(out.shape) != (rows, args.prompt_len + n):
        raise RuntimeError(f"transformers generated {tuple(out.shape)}, expected {(rows, args.prompt_len + n)}")
    tokens = rows * n
    best = min(times)
    print(f"transformers generate: {tokens / best:.1f} tokens/s ({args.prompts} prompts x {args.group} x {n} new "
          f"tokens, prompt {args.prompt_len}; best {best:.3f} s of {len(times)}, warm-up {warmup:.1f} s)",
          flush=True)
    return dict(params=n_params, rows=rows, tokens=tokens, best_s=best, times_s=times, warmup_s=warmup,
                tokens_per_s=tokens / best, device=name, torch=torch.__version__,
                transformers=transformers.__version__,
                peak_bytes=torch.cuda.max_memory_allocated() if device == "cuda" else None)


def part_learner(args) -> dict:
    """`learner_step`; if the accelerator runs out of memory, again with micro-batches of half as many rows."""
    import gc

    import jax

    print(f"learner: {jax_backend()}", flush=True)
    micro = args.micro_batch
    while True:
        try:
            model, mesh = build(model_config(args, dtype="bfloat16", param_dtype="float32"), args.seed + 1)
            with jax.set_mesh(mesh):
                return learner_step(args, model, mesh, micro)
        except Exception as e:  # jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED
            if micro == 1 or not ("RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()):
                raise
            smaller = max(d for d in range(1, micro // 2 + 1) if args.batch % d == 0)
            print(f"learner: out of memory with micro-batches of {micro} rows ({str(e).splitlines()[0][:200]}); "
                  f"again with {smaller}", flush=True)
        model = mesh = None  # the failed attempt's arrays, freed once the exception is gone
        gc.collect()
        micro = smaller


def learner_step(args, model, mesh, micro: int) -> dict:
    import jax
    import numpy as np

    from rrc_jax.rl.grpo import grpo_objective
    from rrc_jax.rl.learner import Learner, make_optimizer, token_logprobs
    from rrc_jax.sharding import put_batch

    n_params = count_params(model)
    b, t, p = args.batch, args.seq_len, args.prompt_part
    response = t - p
    learner = Learner(model, make_optimizer(1e-6), grpo_objective(temperature=1.0, beta=0.0, max_len=response),
                      micro_batch_size=micro)
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(3, model.cfg.vocab_size, (b, t)).astype(np.int32)
    mask = np.ones((b, t), bool)
    # pi_theta_old: the policy's own log-probs, a micro-batch of rows at a time
    old = np.concatenate([np.asarray(token_logprobs(model, ids[i:i + micro], mask[i:i + micro]))
                          for i in range(0, b, micro)])
    batch = put_batch(dict(ids=ids, mask=mask, loss_mask=np.arange(t)[None, :].repeat(b, 0) >= p, old_logp=old,
                           advantages=rng.standard_normal(b).astype(np.float32)), mesh)
    warmup, times, metrics = timed(lambda: jax.block_until_ready(learner.update(batch)), args.learner_steps)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    tokens = b * t
    best = min(times)
    flops = 6 * n_params * tokens
    mfu = flops / best / (args.peak_tflops * 1e12)
    print(f"learner step: {best:.3f} s (best of {len(times)}, warm-up {warmup:.1f} s), {b} x {t} tokens "
          f"({tokens / best:.0f} tokens/s), micro-batches of {micro} rows, {n_params / 1e9:.3f}B params "
          f"float32 master / bfloat16 compute; loss {metrics['loss']:.4f}, skipped {int(metrics['skipped'])}",
          flush=True)
    print(f"MFU: {100 * mfu:.3g}% (6 x {n_params / 1e9:.3f}B params x {tokens} tokens / {best:.3f} s = "
          f"{flops / best / 1e12:.1f} TFLOP/s of {args.peak_tflops:g} peak)", flush=True)
    return dict(params=n_params, batch=b, seq_len=t, micro_batch=micro, tokens=tokens, best_s=best,
                times_s=times, warmup_s=warmup, tflops=flops / best / 1e12, peak_tflops=args.peak_tflops, mfu=mfu,
                loss=metrics["loss"], skipped=int(metrics["skipped"]), backend=jax_backend(),
                peak_bytes=peak_memory())


def run() -> None:
    """Run `--part` and print its `RESULT {json}` line; with `--out_dir`, write it there (module docstring)."""
    args = settled_flags()
    if args.dry_run:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    result = {"sampler": part_sampler, "transformers": part_transformers, "learner": part_learner}[args.part](args)
    result = dict(part=args.part, dry_run=args.dry_run, **result)
    print("RESULT " + json.dumps(result), flush=True)
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"device_{args.part}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    define_flags()
    cli.start(cli.flags_main(run))
