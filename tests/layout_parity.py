"""Run with 8 CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`): the inference layout against the
training layout on one device, and the compiled decode steps of both layouts. Prints one JSON line; any mismatch
raises. Used by `tests/test_layouts.py`.

- parity: a tiny float32 Llama's greedy rollouts (`generate`, GRPO groups), judge verdicts (a `Judge` over
  `complete`, shared prefixes branched to questions) and next-token log-probs, from a sampler in the inference
  layout on meshes (1, 2, 4) and (2, 1, 4) (kv heads 2 < tensor 4: replicated), against one device: tokens and
  verdicts identical, log-probs within 1e-4; the rollout copy after `update_weights` equals a copy made from the
  updated weights.
- gathers: the all-gathers and all-reduces in the compiled decode step (the `lax.while_loop` of
  `rrc_jax.inference.kernels`) of the rollout (a GRPO group's cache) and of the judge (a branched cache of shared
  prefixes) at 16 rows, in the training layout on (1, 8, 1) FSDP and the inference layout on three meshes: their
  result shapes, and those holding as many elements as a weight matrix.
"""

import json
import re
import sys
import tempfile

import jax
import numpy as np
from flax import nnx

from rrc_jax.inference import SamplingParams, make_sampler
from rrc_jax.inference.kernels import _decode, prefill, row_keys, to_the_end
from rrc_jax.judge import Judge
from rrc_jax.models import Decoder, DecoderConfig, load_hf, save_hf
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.sharding import Layout, make_mesh, model_context, use_mesh

GREEDY = SamplingParams(0.0, max_new_tokens=6, stop_token_ids=())
CFG = DecoderConfig(model_type="llama", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=32, max_position_embeddings=256, bos_token_id=1,
                    eos_token_ids=(2,), pad_token_id=0)
PROMPTS = [[1, 5, 6], [1, 7], [1, 9, 9, 9], [1, 11, 12]]
PREFIXES = [[1, 5, 6, 7], [1, 8]]
QUESTIONS = [(0, [3, 4]), (1, []), (0, [9]), (1, [10, 11, 12])]


def rollouts(sampler):
    out = sampler.generate(PROMPTS, 4, GREEDY)
    done = sampler.complete(PREFIXES, QUESTIONS, GREEDY)
    logp = sampler.next_token_logprobs(PREFIXES, QUESTIONS, [3, 4, 5])
    return out.tokens, out.logprobs, done.tokens, logp


def verdicts(sampler, tokenizer):
    """The judge's votes and the text of every judgment (random weights: mostly abstentions, but each text must
    match token for token)."""
    judge = Judge(sampler, tokenizer, template="toy_pairwise_cot", temperature=0.0, max_new_tokens=12)
    votes, log = judge.explain(["ab", "cd", "ab"], ["x", "zz", "u"], ["y", "w", "v"], votes=2)
    return [np.asarray(v).tolist() for v in votes], [x.text for x in log]


def gathers(sampler, group: bool, rows: int) -> list[tuple[int, ...]]:
    """The result shapes of the all-gathers and all-reduces in the compiled decode step of `sampler`'s model over
    `rows` rows."""
    model = sampler.model
    with use_mesh(sampler.mesh):
        ids = np.asarray([[1, 5, 6, 7]] * (rows // 2 if group else rows), np.int32)
        cache = prefill(model, ids, np.ones_like(ids, bool), cache_size=4 if group else 64)
        if group:
            cache = cache.branch(2, size=64)  # `rows` rows continuing rows / 2 shared prefixes (judge questions)
        graphdef, state = nnx.split(model)
        keys = row_keys(0, range(rows))
        text = _decode.lower(graphdef, state, cache, keys, *to_the_end(np.ones(rows, bool), GREEDY.max_new_tokens, 0),
                             params=GREEDY, stop_ids=(2,), pad_id=0,
                             impl="threefry2x32").compile().as_text()
    return [tuple(int(d) for d in shape.split(",") if d)
            for shape in re.findall(r"= \w+\[([\d,]*)\][^=]*? all-(?:gather|reduce)(?:-start)?\(", text)]


def weight_gathers(collectives: list[tuple[int, ...]], weight_sizes: set[int]) -> list[tuple[int, ...]]:
    """Collectives of the decode step that move weights: those whose result holds as many elements as a weight
    matrix, a layer's or the whole stack (XLA may gather a weight reshaped)."""
    return [s for s in collectives if int(np.prod(s)) in weight_sizes]


def main():
    assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    path = tempfile.mkdtemp()
    with model_context(None):
        save_hf(Decoder(CFG, rngs=nnx.Rngs(0)), path)
    tokenizer = make_char_tokenizer()
    one = make_sampler("policy", load_hf(path), max_batch=64)
    want, want_verdicts = rollouts(one), verdicts(make_sampler("grm", load_hf(path), tokenizer), tokenizer)
    result = {"parity": [], "gathers": {}}
    for shape in [(1, 2, 4), (2, 1, 4)]:
        mesh = make_mesh(*shape)
        inference = Layout(make_mesh(*shape), "inference")
        train = Layout(make_mesh(1, 8, 1), "train")
        master = load_hf(path, layout=train)
        sampler = make_sampler("policy", master, max_batch=64, layout=inference)  # the rollout copy
        got = rollouts(sampler)
        for name, a, b in zip(["generate", "logprobs", "complete", "next-token log-probs"], got, want):
            if a.dtype.kind == "f":
                np.testing.assert_allclose(a, b, atol=1e-4, err_msg=f"{name} on {shape}")
            else:
                np.testing.assert_array_equal(a, b, err_msg=f"{name} on {shape}")
        grm = load_hf(path, layout=inference)  # a frozen role loaded straight into its layout
        assert verdicts(make_sampler("grm", grm, tokenizer), tokenizer) == want_verdicts, shape
        spec = grm.layers.attn.qkv[...].sharding.spec  # [L, E, K, G + 2, D]
        assert spec[2] is None and "tensor" not in str(spec[1]), f"kv heads 2 < tensor 4 must replicate: {spec}"
        # the copy follows the master: new weights in, the same as a copy made from them
        new = jax.tree.map(lambda x: x * 1.5, nnx.state(master, nnx.Param))
        moved = sampler.update_weights(new)
        nnx.update(master, new)
        fresh = make_sampler("policy", master, max_batch=64, layout=inference)
        np.testing.assert_array_equal(rollouts(sampler)[0], rollouts(fresh)[0], err_msg=f"synced copy on {shape}")
        result["parity"].append({"mesh": list(shape), "weight_sync_bytes": moved})
        del mesh
    # the weight matrices' sizes: a layer's and the whole stack's (the layers are stacked on a leading axis)
    variables = jax.tree.leaves(nnx.state(load_hf(path), nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))
    stacked = lambda v: v.out_sharding[:1] == ("layers",)
    weight_sizes = {int(np.prod(s)) for v in variables for s in ([v.shape, v.shape[1:]] if stacked(v) else [v.shape])
                    if len(s) >= 2}
    result["weight_sizes"] = sorted(weight_sizes)
    for name, layout in [("train_fsdp8", Layout(make_mesh(1, 8, 1), "train")),
                         ("inference_1x2x4", Layout(make_mesh(1, 2, 4), "inference")),
                         ("inference_2x1x4", Layout(make_mesh(2, 1, 4), "inference")),
                         ("inference_4x1x2", Layout(make_mesh(4, 1, 2), "inference"))]:  # kv heads split too
        sampler = make_sampler("policy", load_hf(path, layout=layout))
        few = {"rollout": gathers(sampler, False, 16), "judge": gathers(sampler, True, 16)}
        result["gathers"][name] = {"rollout": weight_gathers(few["rollout"], weight_sizes),
                                   "judge": weight_gathers(few["judge"], weight_sizes),
                                   "all_rollout": few["rollout"], "all_judge": few["judge"]}
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
