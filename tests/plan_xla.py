"""Run with 8 CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`): the memory planner's per-device
figures against XLA's accounting of the compiled programs. Prints one JSON line per case and `ok`; used by
`tests/test_plan.py`.

A case compiles, for a scaled-down Llama (hidden 256, 4 layers, vocab 1024) on one mesh,

- the learner's update (`Learner._update`, GRPO loss) on 32 rows of 128 tokens (dense attention), with or without
  micro-batches, and of 1024 tokens (`blockwise_attention` over two blocks of keys);
- a decode loop (`rrc_jax.inference.kernels._decode`) over a cache of 16 rows x 256 slots, rows over data x fsdp;
- a decode loop over a branched cache (`KVCache.branch`): 8 prompts' prefixes of 1024 slots, each continued by 2
  rows of 256 slots of their own; prefixes and rows over data x fsdp; and the same as the judge's lanes
  (`KVCache.as_lanes`, continuous batching) with keys and values stored in float8 (`DecoderConfig.kv_dtype`),
  whose arguments (the parameters, the float8 cache and prefixes) are compared: XLA:CPU's temporaries for that
  program are 2 MB above the same program's with a float32 cache, in buffers this check does not attribute.

XLA's figure is what the program holds on a device at its peak: arguments + outputs + temporaries - the outputs
aliased to donated arguments (the parameters and optimizer state are updated in place). The planner's counterpart:
for the update, the resident parameters and optimizer state plus its backward phase (activations, log-prob chunk,
gathered weights, accumulator, weight copy; the gradients build up while activations are freed, so they are not
added); for the decode, the parameters, the cache (donated: the loop updates it in place) and, in the training layout, the
weights gathered for the loop; for the branched decode the shared prefixes (passed to the loop block-major, read in
place by `shared_attention`'s scan over two blocks of 512 slots), the rows' own cache, and a step's scores over a
block. The decode cases run in the training layout and in the inference layout (`rrc_jax.sharding.Layout`:
tensor-parallel, nothing gathered). The sync case compiles the rollout copy's reshard (`RolloutCopy`) of a 16-layer
model from the training layout on (1, 8, 1) into the inference layout on (2, 1, 4): the master, the copy (donated,
updated in place) and the transient (float32 copies: XLA:CPU runs bfloat16 updates in float32).
"""

import json
import sys

import jax
import numpy as np
from flax import nnx

from rrc_jax import plan
from rrc_jax.inference import kernels
from rrc_jax.inference.rollout_copy import RolloutCopy
from rrc_jax.inference.sampler import SamplingParams
from rrc_jax.models import Decoder, DecoderConfig
from rrc_jax.models.kv_cache import init_cache
from rrc_jax.rl.grpo import grpo_objective
from rrc_jax.rl.learner import Learner, make_optimizer
from rrc_jax.sharding import Layout, make_mesh, model_context, put_batch

ROWS, LENGTH, CACHE_ROWS, CACHE_SLOTS = 32, 128, 16, 256
UPDATES = [((1, 1, 1), "bfloat16", 0), ((1, 8, 1), "float32", 0), ((1, 8, 1), "float32", 16),
           ((2, 2, 2), "float32", 0), ((1, 8, 1), "float32", 0, 1024)]
DECODES = [((1, 8, 1), "float32"), ((2, 4, 1), "float32"), ((2, 1, 4), "float32", "inference"),
           ((1, 2, 4), "float32", "inference")]
PREFIXES, PREFIX_SLOTS, GROUP = 8, 1024, 2  # the branched decode: 8 prefixes x 2 rows = CACHE_ROWS
BRANCHED = [((1, 8, 1), "float32"), ((2, 4, 1), "float32"), ((2, 1, 4), "float32", "inference")]
# the judge's lanes (continuous batching): a branched cache whose rows write at cursors of their own, keys and
# values stored in float8 (`reward.judge.kv_dtype`)
LANES = [((2, 1, 4), "float32", "inference")]


def config(dtype: str, param_dtype: str = "float32") -> DecoderConfig:
    return DecoderConfig(model_type="llama", vocab_size=1024, hidden_size=256, intermediate_size=768, num_layers=4,
                         num_heads=8, num_kv_heads=4, head_dim=32, max_position_embeddings=1024, dtype=dtype,
                         param_dtype=param_dtype)


def peak(compiled) -> int:
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def compiled_update(cfg, mesh, micro: int, length: int = LENGTH):
    """The learner's update (GRPO loss) of `cfg`'s model on `mesh`, compiled for ROWS rows of `length` tokens in
    micro-batches of `micro` rows (0: none)."""
    with jax.set_mesh(mesh):
        with model_context(mesh):
            model = Decoder(cfg, rngs=nnx.Rngs(0))
        learner = Learner(model, make_optimizer(1e-3), grpo_objective(), micro_batch_size=micro)
        rng = np.random.default_rng(0)
        batch = put_batch({"ids": rng.integers(3, cfg.vocab_size, (ROWS, length)).astype(np.int32),
                           "mask": np.ones((ROWS, length), bool), "loss_mask": np.ones((ROWS, length), bool),
                           "advantages": rng.normal(size=ROWS).astype(np.float32),
                           "old_logp": np.zeros((ROWS, length), np.float32)}, mesh)
        return learner._update.lower(learner.params, learner.opt_state, learner._rest, batch,
                                     n_micro=ROWS // (micro or ROWS)).compile()


def update_case(shape, dtype, micro, length=LENGTH) -> dict:
    cfg = config(dtype)
    compiled = compiled_update(cfg, make_mesh(*shape), micro, length)
    rows = micro or ROWS
    p32 = plan.param_bytes(cfg, "float32", shape)
    parts = {"parameters + optimizer": 3 * p32,
             "activations": plan.activation_bytes(cfg, rows, length, shape, dtype),
             "log-prob chunk": plan.logprob_chunk_bytes(cfg, rows, 128, shape)}
    if micro:
        parts["accumulator"] = p32
        parts["gathered weights"] = plan.gathered_bytes(cfg, "float32", shape)
    else:
        parts["gathered LM head"] = plan.gathered_bytes(cfg, "float32", shape, lm_head_only=True)
    if dtype != "float32":
        parts["weight copy"] = plan.param_bytes(cfg, dtype, shape if not micro else (shape[0], 1, shape[2]))
    return {"case": f"update mesh={shape} {dtype} micro={micro} length={length}", "xla": peak(compiled),
            "plan": sum(parts.values()), "parts": parts}


def placed(cfg, mesh, kind: str):
    """`Decoder(cfg)` with its parameters placed in layout `kind` on `mesh` (`rrc_jax.sharding.Layout`)."""
    with model_context(None):
        graphdef, state = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)))
    layout = Layout(mesh, kind)
    leaves, tree = jax.tree.flatten(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    leaves = [v.replace(jax.device_put(v.get_value(), layout.sharding(v.out_sharding, v.get_value().shape)))
              for v in leaves]
    return graphdef, jax.tree.unflatten(tree, leaves)


def decode_case(shape, dtype, layout: str = "train", branched: bool = False, kv: str = "") -> dict:
    cfg = config(dtype, dtype).replace(kv_dtype=kv)
    mesh = make_mesh(*shape)
    with jax.set_mesh(mesh):
        graphdef, state = placed(cfg, mesh, layout)
        if branched:  # 8 prefixes (sharded by branch) continued by 2 rows each
            cache = jax.jit(lambda: init_cache(cfg, PREFIXES, PREFIX_SLOTS))().branch(GROUP, CACHE_SLOTS)
            cache = cache.as_lanes() if kv else cache
        else:  # placed as a prefill leaves it: rows over data x fsdp, kv heads over tensor
            cache = jax.jit(lambda: init_cache(cfg, CACHE_ROWS, CACHE_SLOTS))()
        keys = kernels.row_keys(0, range(CACHE_ROWS))  # each row's stream
        compiled = kernels._decode.lower(graphdef, state, cache, keys,
                                          *kernels.to_the_end(np.ones(CACHE_ROWS, bool), 8, 0),
                                          params=SamplingParams(1.0, max_new_tokens=8),
                                          stop_ids=(2,), pad_id=0, impl="threefry2x32").compile()
    parts = {"parameters": plan.param_bytes(cfg, dtype, shape, layout),
             "cache": plan.kv_cache_bytes(cfg, CACHE_ROWS, CACHE_SLOTS, shape, dtype),  # donated
             "gathered weights": plan.gathered_bytes(cfg, dtype, shape) if layout == "train" else 0}
    if branched:  # the prefixes once (read in place, block-major), the rows' own slots (donated)
        parts["cache"] = plan.kv_cache_bytes(cfg, PREFIXES * GROUP, CACHE_SLOTS, shape, dtype)
        parts["shared prefixes"] = plan.kv_cache_bytes(cfg, PREFIXES, PREFIX_SLOTS, shape, dtype, shared=True)
        parts["prefix scores"] = plan.decode_step_bytes(cfg, CACHE_ROWS, PREFIX_SLOTS, shape)
    kind = "lanes " if kv else "branched " if branched else ""
    if kv:  # what the program holds, its arguments: the parameters, the float8 cache and prefixes
        parts = {"parameters": parts["parameters"], "cache": parts["cache"], "shared prefixes": parts["shared prefixes"]}
        return {"case": f"{kind}decode mesh={shape} {dtype} {layout} {kv}, arguments",
                "xla": compiled.memory_analysis().argument_size_in_bytes, "plan": sum(parts.values()), "parts": parts}
    return {"case": f"{kind}decode mesh={shape} {dtype} {layout}", "xla": peak(compiled),
            "plan": sum(parts.values()), "parts": parts}


def sync_case(layers: int = 16) -> dict:
    cfg = config("float32").replace(num_layers=layers)
    train, shape = make_mesh(1, 8, 1), (2, 1, 4)
    with model_context(None):
        master = RolloutCopy(Decoder(cfg, rngs=nnx.Rngs(0)), Layout(train, "train"), "float32").model
    copy = RolloutCopy(master, Layout(make_mesh(*shape, devices=list(train.devices.flat)), "inference"), "float32")
    compiled = copy._reshard.lower(copy._leaves(nnx.state(master, nnx.Param)), copy._values).compile()
    parts = {"master": plan.param_bytes(cfg, "float32", (1, 8, 1)),
             "rollout copy": plan.param_bytes(cfg, "float32", shape, "inference"),
             "sync transient": plan.sync_transient_bytes(cfg, "float32")}
    return {"case": f"sync {layers} layers (1, 8, 1) -> {shape} float32", "xla": peak(compiled),
            "plan": sum(parts.values()), "parts": parts}


def main() -> None:
    assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    for args in UPDATES:
        print(json.dumps(update_case(*args)), flush=True)
    for args in DECODES:
        print(json.dumps(decode_case(*args)), flush=True)
    for args in BRANCHED:
        print(json.dumps(decode_case(*args, branched=True)), flush=True)
    for args in LANES:
        print(json.dumps(decode_case(*args, branched=True, kv="float8_e4m3fn")), flush=True)
    print(json.dumps(sync_case()), flush=True)
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
