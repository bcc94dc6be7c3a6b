"""The learner's own work: XLA's FLOP count of the compiled GRPO update and log-prob pass against the minimum.

    python benchmarks/learner_work.py [--rows=64 --prompt_len=64 --new_tokens=128 --remat=false --out=FILE]

On benchmarks/peers.py's checkpoint shape (3.2M parameters, float32) and batch (rows x prompt + new tokens), it
compiles this project's `Learner` update (`grpo_objective`, beta 0, one AdamW step) and the `token_logprobs` pass,
reads `compiled.cost_analysis()["flops"]`, and compares each with the minimum a dense transformer needs: per
token 2 FLOP per matmul parameter forward (the LM head included, the embedding lookup not) and twice that
backward, plus causal attention (`4 x heads x head_dim x (T + 1) / 2` forward per token and layer, twice that
backward). A ratio well above 1 is work beyond the model's (recomputation, passes that could be fused); XLA counts
what it compiled, whatever the kernels' speed. Prints a table and writes benchmarks/results/learner_work.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx

from rrc_jax import cli
from rrc_jax.models import Decoder, DecoderConfig
from rrc_jax.plan import matmul_params
from rrc_jax.rl.grpo import grpo_objective
from rrc_jax.rl.learner import Learner, _token_logprobs, make_optimizer

REPO = Path(__file__).resolve().parent.parent
MODEL = dict(model_type="llama", vocab_size=128, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4,
             num_kv_heads=2, head_dim=64, rope_theta=1e6, tie_word_embeddings=True, max_position_embeddings=512,
             bos_token_id=1, eos_token_ids=(2,), pad_token_id=0)


def xla_flops(compiled) -> float:
    """XLA's FLOP count of a compiled program (`cost_analysis`; a loop's body counts once, not per iteration)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


def matmul_flops(jaxpr) -> float:
    """The matmul FLOPs of a closed jaxpr, 2 per multiply-add of every `dot_general`, a `scan`'s body counted
    `length` times, a `cond` at its costliest branch, every other sub-jaxpr (remat, pjit, custom derivatives)
    once: the work the program asks for, with the recomputation a checkpoint adds."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lc, rc), (lb, _) = eqn.params["dimension_numbers"]
            lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
            contract = np.prod([lhs[d] for d in lc])
            total += 2.0 * np.prod(lhs) * np.prod(rhs) / contract / np.prod([lhs[d] for d in lb])
            continue
        subs = [v for v in eqn.params.values() if isinstance(v, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr))]
        subs += [b for v in eqn.params.values() if isinstance(v, (tuple, list)) for b in v
                 if isinstance(b, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr))]
        counts = [matmul_flops(x.jaxpr if hasattr(x, "jaxpr") else x) for x in subs]
        if eqn.primitive.name == "scan":
            total += eqn.params["length"] * sum(counts)
        elif eqn.primitive.name == "cond":
            total += max(counts, default=0.0)
        else:
            total += sum(counts)
    return total


def minimum(cfg: DecoderConfig, rows: int, length: int, passes: int) -> float:
    """The dense transformer's FLOPs for `rows` sequences of `length` tokens: `passes` = 1 forward, 3 forward and
    backward."""
    tokens = rows * length
    attention = 4 * cfg.num_heads * cfg.head_dim * (length + 1) / 2 * cfg.num_layers  # per token, causal
    return passes * (2 * matmul_params(cfg) + attention) * tokens


def measure(rows: int, prompt_len: int, new_tokens: int, remat: bool) -> dict:
    cfg = DecoderConfig(**MODEL)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    length = prompt_len + new_tokens
    ids = np.random.default_rng(0).integers(3, cfg.vocab_size, (rows, length)).astype(np.int32)
    mask = np.ones_like(ids, bool)
    batch = dict(ids=jnp.asarray(ids), mask=jnp.asarray(mask),
                 loss_mask=jnp.asarray(np.arange(length)[None].repeat(rows, 0) >= prompt_len),
                 old_logp=jnp.zeros((rows, length), jnp.float32), advantages=jnp.ones((rows,), jnp.float32))
    learner = Learner(model, make_optimizer(1e-6), grpo_objective(temperature=1.0, beta=0.0, max_len=new_tokens,
                                                                  remat=remat))
    graphdef, state = nnx.split(model)
    programs = {"update": (learner._update, (learner.params, learner.opt_state, learner._rest, batch),
                           dict(n_micro=1), 3),
                "logprobs": (_token_logprobs, (graphdef, state, batch["ids"], batch["mask"]),
                             dict(temperature=1.0, chunk_size=128, n_micro=1), 1)}
    out = {"params": int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))),
           "matmul_params": matmul_params(cfg), "rows": rows, "tokens": rows * length, "remat": remat}
    for name, (fn, args, kwargs, passes) in programs.items():
        lowered = fn.lower(*args, **kwargs)
        traced = fn.trace(*args, **kwargs).jaxpr
        least = minimum(cfg, rows, length, passes)
        work = matmul_flops(traced.jaxpr)
        out[name] = {"matmul_flops": work, "minimum_flops": least, "ratio": work / least,
                     "xla_cost_analysis_flops": xla_flops(lowered.compile())}
    return out


def run() -> None:
    f = flags.FLAGS
    result = measure(f.rows, f.prompt_len, f.new_tokens, f.remat)
    print(f"{'program':<10} {'matmul GFLOP':>12} {'minimum GFLOP':>14} {'ratio':>6} {'XLA cost analysis':>18}")
    for name in ("update", "logprobs"):
        r = result[name]
        print(f"{name:<10} {r['matmul_flops'] / 1e9:>12.2f} {r['minimum_flops'] / 1e9:>14.2f} {r['ratio']:>6.2f} "
              f"{r['xla_cost_analysis_flops'] / 1e9:>18.2f}")
    out = Path(f.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


def define_flags() -> None:
    flags.DEFINE_integer("rows", 64, "sequences in the update (peers.py: 8 prompts x 8)")
    flags.DEFINE_integer("prompt_len", 64, "prompt tokens a sequence")
    flags.DEFINE_integer("new_tokens", 128, "completion tokens a sequence")
    flags.DEFINE_bool("remat", False, "recompute each block in the backward pass (rl.remat)")
    flags.DEFINE_string("out", str(REPO / "benchmarks" / "results" / "learner_work.json"), "where the JSON goes")


if __name__ == "__main__":
    define_flags()
    cli.start(cli.flags_main(run))
