"""tunix's GRPOLearner with RRC rewards: SCR over each prompt's group, judged by the toy world's GRM.

    bash .ci/tunix_env && .venv-tunix/bin/python examples/tunix_rewards.py [--url=http://127.0.0.1:8000]
    [--record=FILE] [--toy_cache=~/.cache/rrc_jax]

Two GRPO steps of the toy policy (loaded from its Hugging Face directory into tunix's Llama) on the CPU. tunix
0.1.7 pins `safetensors<0.8`, so it lives in an environment of its own (`.ci/tunix_env`: this environment plus
tunix and the releases it pins). Without `--url` the judge runs in this process on the JAX engine; with it, it is
asked over HTTP (`python -m rrc_jax.serve`). `--record=FILE` writes each reward call's prompts, completions,
rewards, `num_generations` and the judge's trace, the largest parameter change and tunix's logged reward sums
(`tests/test_tunix.py` reads them).

tunix's Llama applies RoPE with theta 1e6 whatever the checkpoint says (tunix 0.1.7), so the policy it trains is
the toy policy's weights in a slightly different model: what it shows is the reward function's contract.
"""

import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from absl import flags  # noqa: E402
from flax import nnx  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402

from rrc_jax import cli  # noqa: E402
from rrc_jax.data.toy.task import SortTask  # noqa: E402
from rrc_jax.data.toy.world import WorldSettings, build_world  # noqa: E402
from rrc_jax.integrations import judge_for  # noqa: E402
from rrc_jax.integrations.tunix import TunixReward, tunix_llama, tunix_mesh  # noqa: E402

G, BATCH = 4, 2


def main(policy_dir, grm_dir, url="", record=""):
    judge = judge_for(grm_dir, url=url, template="toy_pairwise_cot", max_new_tokens=48, temperature=0.0)
    reward = TunixReward(judge, "scr", votes=1)
    calls = []

    def recorded(prompts, completions, num_generations=None, **columns):
        judge.trace = []
        out = reward(prompts, completions, num_generations=num_generations, **columns)
        calls.append({"prompts": [str(p) for p in prompts], "completions": list(map(str, completions)),
                      "rewards": out, "num_generations": num_generations, "trace": judge.trace,
                      "columns": sorted(columns)})
        judge.trace = None
        return out

    recorded.__name__ = reward.__name__
    mesh = tunix_mesh()
    actor, reference = tunix_llama(policy_dir, mesh), tunix_llama(policy_dir, mesh)
    before = jax.tree.map(np.asarray, nnx.state(actor, nnx.Param))
    cluster = rl_cluster_lib.RLCluster(
        actor=actor, reference=reference, tokenizer=AutoTokenizer.from_pretrained(policy_dir),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.REFERENCE: mesh,
                          rl_cluster_lib.Role.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False,
            training_config=rl_cluster_lib.RLTrainingConfig(
                actor_optimizer=optax.adamw(1e-3), eval_every_n_steps=1000, max_steps=2,
                checkpoint_root_directory=None, metrics_logging_options=None, pbar_description=None),
            rollout_config=base_rollout.RolloutConfig(max_tokens_to_generate=12, max_prompt_length=16,
                                                      kv_cache_size=48, temperature=1.0, top_p=1.0, top_k=None,
                                                      seed=0)))
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, algo_config=grpo_learner.GRPOConfig(num_generations=G, num_iterations=1, beta=0.04,
                                                                epsilon=0.2),
        reward_fns=[recorded])
    prompts = [SortTask.prompt_text(d) for d in ("3142", "97531", "2718", "60504")]
    learner.train([{"prompts": np.array(prompts[i:i + BATCH])} for i in range(0, len(prompts), BATCH)])
    after = jax.tree.map(np.asarray, nnx.state(actor, nnx.Param))
    moved = max(jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), before, after)))
    logged = cluster._rl_metrics_logger.get_metric_history("rewards", "sum", "train")
    print(f"rewards (mean of each step): {[float(np.mean(c['rewards'])) for c in calls]}; largest parameter change "
          f"{moved:.2e}")
    if record:
        json.dump({"calls": calls, "moved": moved, "logged_reward_sums": np.asarray(logged).tolist(),
                   "steps": int(cluster.actor_trainer.train_steps)}, open(record, "w"))


def define_flags() -> None:
    """The example's flags (module docstring)."""
    flags.DEFINE_string("toy_cache", "~/.cache/rrc_jax", "Where the packaged toy world is built (or found).")
    flags.DEFINE_string("url", "", "The judge's server (`python -m rrc_jax.serve`); empty: the judge in this process.")
    flags.DEFINE_string("record", "", "Write each reward call, the parameter change and tunix's reward sums here.")


def run() -> None:
    """Two GRPO steps of the toy world's policy with SCR rewards (module docstring)."""
    args = flags.FLAGS
    world = build_world(WorldSettings(), args.toy_cache)  # the packaged toy world
    main(str(world.policy), str(world.grm), args.url, args.record)


if __name__ == "__main__":
    define_flags()
    cli.start(cli.flags_main(run))
