"""Reinforcement learning with generative rewards: GRPO math (`grpo`), the RewardFn seam and the built-in reward
kinds (`reward_fns`), AGR's anchors (`anchors`), models by role (`roles`), the jitted update (`learner`) and the
loop (`trainer`)."""
