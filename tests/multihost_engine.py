"""One host of `test_multihost.py::test_each_host_samples_and_judges_only_its_own_rows`, or the single-process
reference: `python multihost_engine.py OUT [COORDINATOR NUM_PROCESSES PROCESS_ID]`.

Every host builds the same tiny random decoder on an (1, -1, 1) mesh over all devices and passes only its own part
of a fixed workload to the engine and the judge, host 1 a smaller part than host 0 and no groups to rank at all
(its tournaments must still take part in every round). The single-process run does the whole workload at once.
Each process writes its own results (greedy tokens and log-probs) to `OUT.<process id>.json`.
"""

import json
import sys

import jax
import numpy as np
from flax import nnx

from rrc_jax import distributed
from rrc_jax.inference import SamplingParams, make_sampler
from rrc_jax.judge import Judge
from rrc_jax.judge.matches import knockout, merge_sort
from rrc_jax.models import Decoder, DecoderConfig
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.constructions.drm import DRMReward
from rrc_jax.sharding import make_mesh, model_context

GREEDY = SamplingParams(0.0, max_new_tokens=6, stop_token_ids=())
CFG = DecoderConfig(model_type="llama", vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=1024, bos_token_id=1,
                    eos_token_ids=(2,), pad_token_id=0)


def workload():
    """The questions' prefixes, and prompts, questions and groups to rank, each as (host 0's part, host 1's
    part)."""
    rng = np.random.default_rng(0)
    prompts = [[1] + rng.integers(3, 128, int(n)).tolist() for n in rng.integers(2, 30, 5)]
    prefixes = [[1] + rng.integers(3, 128, int(n)).tolist() for n in (5, 40, 9)]
    suffixes = [(int(o), rng.integers(3, 128, int(rng.integers(0, 20))).tolist()) for o in [0, 1, 1, 2, 0, 1, 2, 2, 0]]
    groups = [("why?", ["a", "bb", "ccc", "dddd"]), ("how?", ["x", "yy", "zzz", "w"])]
    return prefixes, {"prompts": (prompts[:4], prompts[4:]), "suffixes": (suffixes[:6], suffixes[6:]),
                      "groups": (groups, [])}


def main(out: str, *dist: str) -> None:
    if dist:
        distributed.initialize(distributed.DistributedConfig(dist[0], int(dist[1]), int(dist[2])))
    mesh = make_mesh(1, -1, 1)
    with model_context(mesh):
        model = Decoder(CFG, rngs=nnx.Rngs(0))
        drm = Decoder(CFG.replace(value_head=True), rngs=nnx.Rngs(1))
        kernel = drm.value_head.kernel
        kernel[...] = jax.random.normal(jax.random.key(2), kernel.shape, kernel.dtype)  # zeros at init
    prefixes, work = workload()
    part = (lambda x: x[0] + x[1]) if not dist else (lambda x: x[jax.process_index()])
    prompts, suffixes, groups = part(work["prompts"]), part(work["suffixes"]), part(work["groups"])
    tokenizer = make_char_tokenizer()
    results = {}
    with jax.set_mesh(mesh):
        sampler = make_sampler("policy", model, max_batch=16)
        gen = sampler.generate(prompts, 2, GREEDY)
        results["generate"] = gen.tokens.tolist()
        for reuse in (True, False):
            done = make_sampler("policy", model, max_batch=8, prefix_reuse=reuse).complete(prefixes, suffixes, GREEDY)
            results[f"complete_{reuse}"] = done.tokens.tolist()
            results[f"complete_{reuse}_logprobs"] = done.logprobs.tolist()
        results["next_token"] = make_sampler("policy", model, max_batch=8).next_token_logprobs(prefixes, suffixes,
                                                                                   [5, 9]).tolist()
        judge = Judge(make_sampler("grm", model, tokenizer, max_batch=16), tokenizer, template="toy_pairwise_direct",
                      max_new_tokens=4, temperature=0.0)
        texts, responses = [g[0] for g in groups], [g[1] for g in groups]
        results["merge_sort"] = merge_sort(judge, texts, responses).order.tolist()
        results["knockout"] = knockout(judge, texts, responses).order.tolist()
        results["drm"] = DRMReward(drm, tokenizer, max_batch=4).scores(
            [t for t, g in groups for _ in g], [r for g in responses for r in g]).tolist()
        results["gathered"] = distributed.gather_texts([f"host {jax.process_index()}: {len(suffixes)}"])
        results["metrics"] = distributed.reduce_metrics({"judge/questions": judge.metrics.questions,
                                                         "reward/mean": float(len(suffixes))})
    with open(f"{out}.{jax.process_index()}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
