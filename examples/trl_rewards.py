"""TRL's GRPOTrainer with RRC rewards: SCR over each prompt's group, judged by the toy world's GRM.

    pip install -e '.[trl]' && python examples/trl_rewards.py [--url=http://127.0.0.1:8000]

Two GRPO steps of the toy policy (a Llama checkpoint transformers loads) on the CPU. Without `--url` the judge runs
in this process on the JAX engine; with it, it is asked over HTTP, e.g. the toy GRM served by
`python -m rrc_jax.serve --model=~/.cache/rrc_jax/toy-.../grm` (the path this script prints).
"""

from absl import flags
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from rrc_jax import cli
from rrc_jax.data.toy.task import SortTask
from rrc_jax.data.toy.world import WorldSettings, build_world
from rrc_jax.integrations import judge_for
from rrc_jax.integrations.trl import TRLReward

PROMPTS = [SortTask.prompt_text(d) for d in ("3142", "97531", "2718", "60504")]  # the toy task: sort the digits


def make_trainer(policy: str, reward, output_dir: str, steps: int = 2, group: int = 4) -> GRPOTrainer:
    """TRL's trainer of `policy` with `reward` (a TRL reward function), two prompts of `group` a step."""
    args = GRPOConfig(output_dir=output_dir, max_steps=steps, num_generations=group,
                      per_device_train_batch_size=2 * group, max_completion_length=12, learning_rate=1e-3,
                      logging_steps=1, save_strategy="no", report_to="none", seed=0, disable_tqdm=True,
                      use_cpu=True, bf16=False, activation_checkpointing=False)
    return GRPOTrainer(model=policy, reward_funcs=[reward], args=args,
                       train_dataset=Dataset.from_dict({"prompt": PROMPTS}))


def define_flags() -> None:
    """The example's flags (module docstring)."""
    flags.DEFINE_string("url", "", "The judge's server (`python -m rrc_jax.serve`); empty: the judge in this process.")


def run() -> None:
    """Two GRPO steps of the toy policy with SCR rewards; print each step's mean reward (module docstring)."""
    url = flags.FLAGS.url
    world = build_world(WorldSettings(), "~/.cache/rrc_jax")  # the packaged toy world: policy, grm, drm
    print(f"policy {world.policy}, judge {world.grm}" + (f" served at {url}" if url else ""))
    judge = judge_for(str(world.grm), url=url, template="toy_pairwise_cot", max_new_tokens=48, temperature=0.0)
    reward = TRLReward(judge, "scr", group_size=4, votes=1)  # or cara=True; "agr" (+ an anchors column), "prc", "swiss"
    trainer = make_trainer(str(world.policy), reward, output_dir="/tmp/trl_rewards")
    trainer.train()
    print([h["rewards/rrc_scr/mean"] for h in trainer.state.log_history if "rewards/rrc_scr/mean" in h])


if __name__ == "__main__":
    define_flags()
    cli.start(cli.flags_main(run))
