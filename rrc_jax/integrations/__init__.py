"""RRC rewards where users already train: reward functions for TRL and tunix over any Sampler backend.

* ``groups``: `GroupRewards` (a registry kind's rewards of each prompt group of a flat batch: SCR and CARA, AGR,
  PRC, the tournaments), `judge_whole` (groups split
  across processes gathered, judged once, scattered back), `judge_for` (a judge from a directory, in process or
  served over HTTP).
* ``trl``: `TRLReward`, a TRL `GRPOTrainer` reward function.
* ``tunix``: `TunixReward`, a tunix `GRPOLearner` reward function; `tunix_llama` and `tunix_mesh`, a Hugging Face
  Llama checkpoint in tunix's model on its mesh.

Neither trainer is imported until its module is.
"""

from rrc_jax.integrations.groups import GroupRewards, judge_for, judge_whole

__all__ = ["GroupRewards", "judge_for", "judge_whole"]
