"""Run with 8 CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`): a tiny Llama on each mesh of
`MESHES` against the same model on one device. Prints one line per mesh and `ok` at the end; any mismatch raises.

Checked per mesh: logits within 1e-4; greedy `JaxSampler.generate` (groups, shared prefixes) token for token; one
GRPO learner step on a fixed batch gives parameters within 1e-5 (relative to their scale) of the single-device
step; on the last mesh also `JaxSampler.complete` (prefixes branched to questions) token for token. Used by
`tests/test_mesh.py`.
"""

import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rrc_jax.models.batches import completion_batch
from rrc_jax.inference import SamplingParams, make_sampler
from rrc_jax.models import Decoder, DecoderConfig, load_hf, save_hf
from rrc_jax.rl.grpo import grpo_objective
from rrc_jax.rl.learner import Learner, make_optimizer, token_logprobs
from rrc_jax.sharding import Layout, make_mesh, model_context, put_batch

MESHES = [(8, 1, 1), (1, 8, 1), (2, 4, 1), (2, 2, 2)]  # each axis alone, data replicas over fsdp, all three
# (test_mesh trains on (1, 4, 2))
GREEDY = SamplingParams(0.0, max_new_tokens=6, stop_token_ids=())


def tiny_checkpoint(path):
    cfg = DecoderConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                        num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=128, bos_token_id=1,
                        eos_token_ids=(2,), pad_token_id=0)
    with model_context(None):
        save_hf(Decoder(cfg, rngs=nnx.Rngs(0)), path)


def fixed_batch(model):
    rng = np.random.default_rng(0)
    prompts = [[1] + list(rng.integers(3, 64, int(rng.integers(2, 6)))) for _ in range(8)]
    responses = [list(rng.integers(3, 64, int(rng.integers(1, 7)))) for _ in range(8)]
    batch = completion_batch(prompts, responses, 0)
    batch["advantages"] = rng.normal(size=8).astype(np.float32)
    batch["old_logp"] = np.asarray(token_logprobs(model, jnp.asarray(batch["ids"]), jnp.asarray(batch["mask"]))) - 0.01
    return batch


def run(path, mesh, complete=False):
    """(logits, generated tokens, completed tokens or None, parameters after one step) of the model on `mesh`."""
    model = load_hf(path, layout=Layout(mesh))
    ids = np.random.default_rng(1).integers(3, 64, (8, 12)).astype(np.int32)
    batch = fixed_batch(load_hf(path))
    with jax.set_mesh(mesh) if mesh is not None else nnx.use_eager_sharding(False):
        forward = nnx.jit(lambda m, x, mask: m(x, mask))
        logits = np.asarray(jax.device_get(forward(model, *put_batch((ids, np.ones_like(ids)), mesh))))
        sampler = make_sampler("policy", model, max_batch=16)
        generated = sampler.generate([[1, 5, 6], [1, 7], [1, 9, 9, 9]], 4, GREEDY).tokens
        completed = sampler.complete([[1, 5, 6, 7], [1, 8]], [(0, [3, 4]), (1, []), (0, [9]), (1, [10, 11, 12])],
                                     GREEDY).tokens if complete else None
        steps = []
        for micro in (0, 2):  # the whole minibatch, then in micro-batches of 2 rows (per data replica on a mesh)
            learner = Learner(load_hf(path, layout=Layout(mesh)) if micro else model, make_optimizer(1e-2),
                              grpo_objective(beta=0.0), micro_batch_size=micro)
            metrics = jax.device_get(learner.update(put_batch(batch, mesh)))
            assert metrics["skipped"] == 0, metrics
            steps.append((jax.tree.map(np.asarray, jax.device_get(nnx.to_pure_dict(learner.params))), metrics))
    return logits, generated, completed, steps


def main():
    assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    path = tempfile.mkdtemp()
    tiny_checkpoint(path)
    want = run(path, None, complete=True)
    for shape in MESHES:
        mesh = make_mesh(*shape)
        logits, generated, completed, params = run(path, mesh, complete=shape == MESHES[-1])
        np.testing.assert_allclose(logits, want[0], atol=1e-4, err_msg=f"logits on {shape}")
        np.testing.assert_array_equal(generated, want[1], err_msg=f"generate on {shape}")
        if completed is not None:
            np.testing.assert_array_equal(completed, want[2], err_msg=f"complete on {shape}")
        for step, metrics in params:  # with and without micro-batches, against one device without
            for a, b in zip(jax.tree.leaves(step), jax.tree.leaves(want[3][0][0])):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(1.0, float(np.abs(b).max())),
                                           err_msg=f"learner step on {shape}")
            for name, value in want[3][0][1].items():  # loss, ratio min / max / mean, clip fractions, ...
                np.testing.assert_allclose(metrics[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{name} on {shape}")
        print(f"mesh {shape}: logits, generate{', complete' if completed is not None else ''} and a learner step "
              "(with micro-batches too) match one device", flush=True)
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
