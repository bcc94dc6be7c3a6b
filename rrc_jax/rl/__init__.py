"""Reinforcement learning with generative rewards: GRPO math (`grpo`), AGR's anchor store (`anchor_store`), models by role
(`roles`), the jitted update (`learner`) and the loop (`trainer`). The reward constructions are in
`rrc_jax.constructions`."""
