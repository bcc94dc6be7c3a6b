"""The trainer's configuration: defaults for every recipe and start-up validation.

`configs/{agr,scr,prc,drm}.py` call `base_config(kind)`; the command line overrides fields
(`--config.reward.votes=8 --config.rl.group_size=16`). Unknown keys are rejected by ml_collections (the configs
are locked); `validate` rejects inconsistent values with one message naming the field and the fix.
"""

from __future__ import annotations

import ml_collections

REWARD_KINDS = ("drm", "prc", "scr", "agr")
TIES = ("half", "zero", "win")
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")


def base_config(kind: str = "agr") -> ml_collections.ConfigDict:
    """Defaults: the toy world on a laptop CPU (a few minutes); point `models.*` and `data.*` at real checkpoints
    and datasets to scale up."""
    c = ml_collections.ConfigDict()
    c.workdir = f"workdir/{kind}"
    c.steps = 40
    c.seed = 0
    c.init_from = ""  # another run's checkpoint directory (workdir/checkpoints) to start the policy from

    # Hugging Face model directories, or "toy" for the embedded toy world's models.
    c.models = ml_collections.ConfigDict(dict(policy="toy", reference="", grm="toy", drm="toy", dtype="float32"))

    # Prompts: "toy" or a local jsonl / json / parquet file with one prompt per row in `field`.
    c.data = ml_collections.ConfigDict(dict(path="toy", field="prompt", eval_path="", eval_prompts=256,
                                            max_prompt_tokens=512))

    c.toy = ml_collections.ConfigDict(dict(
        cache_dir="~/.cache/rrc_jax", seed=0, min_len=4, max_len=6, noise=0.3, train_prompts=2048,
        policy_steps=500, grm_steps=1200, drm_steps=400))

    c.rl = ml_collections.ConfigDict(dict(
        group_size=8,            # m responses per prompt
        prompts_per_step=16,     # B prompts per step
        max_new_tokens=12,
        temperature=1.0,
        top_p=1.0,
        mu=1,                    # passes over each step's rollouts
        minibatch_size=64,       # sequences per optimizer update
        learning_rate=2e-4,
        lr_schedule="constant",  # or "cosine"
        warmup_steps=0,
        grad_clip=1.0,
        eps_low=0.2,
        eps_high=0.2,
        beta=0.0,                # KL coefficient to the frozen reference
        loss_aggregation="seq_mean_token_mean",
    ))

    c.reward = ml_collections.ConfigDict(dict(
        kind=kind,
        alpha=1.0,
        votes=2,                 # V judge votes per pair
        swap=True,               # half the votes show the pair in reversed order
        ties="half",
        cara=False,              # SCR: Kemeny aggregation (Eq. 21)
        cara_method="greedy",
        judge_template="toy_pairwise_cot",
        judge_max_new_tokens=24,
        judge_temperature=0.0,
        judge_max_batch=256,
        prc_think=True,
        anchors_path="",         # default workdir/anchors.jsonl
        n_anchors=4,
        anchor_refresh_every=0,  # > 0: regenerate anchors from the current policy every k steps
    ))

    c.checkpoint = ml_collections.ConfigDict(dict(save_every=10, keep=2))
    c.eval = ml_collections.ConfigDict(dict(every=10, judge_votes=2))
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
    c.lock()
    return c


def validate(c: ml_collections.ConfigDict) -> None:
    """Raise ValueError naming the first inconsistent field and how to fix it."""
    def bad(field: str, msg: str):
        raise ValueError(f"config.{field}: {msg}")

    if c.steps < 0:
        bad("steps", f"{c.steps} must be >= 0")
    r, rl = c.reward, c.rl
    if r.kind not in REWARD_KINDS:
        bad("reward.kind", f"{r.kind!r} is not one of {', '.join(REWARD_KINDS)}")
    if r.ties not in TIES or (r.ties == "win" and r.kind != "agr"):
        bad("reward.ties", f"{r.ties!r}: use 'half' or 'zero' ('win' only with reward.kind='agr')")
    if r.cara and r.kind != "scr":
        bad("reward.cara", "CARA aggregates an SCR tournament; set reward.kind='scr' or reward.cara=False")
    if r.cara_method not in ("greedy", "exact"):
        bad("reward.cara_method", f"{r.cara_method!r}: use 'greedy' or 'exact'")
    if r.cara and r.cara_method == "exact" and rl.group_size > 16:
        bad("reward.cara_method", f"'exact' Kemeny needs rl.group_size <= 16, got {rl.group_size}")
    if r.votes < 1:
        bad("reward.votes", f"{r.votes} must be >= 1")
    if r.votes > 1 and r.judge_temperature == 0 and not r.swap:
        bad("reward.votes", "greedy judging (judge_temperature=0) without swap gives V identical votes; set "
                            "reward.judge_temperature > 0 or reward.swap=True or reward.votes=1")
    if r.kind == "agr" and r.n_anchors < 1:
        bad("reward.n_anchors", f"{r.n_anchors} must be >= 1 for AGR")
    if r.anchor_refresh_every < 0:
        bad("reward.anchor_refresh_every", "must be >= 0 (0 = never)")
    if rl.group_size < 2:
        bad("rl.group_size", f"{rl.group_size}: GRPO needs at least 2 responses per prompt")
    if rl.prompts_per_step < 1 or rl.mu < 1 or rl.max_new_tokens < 1:
        bad("rl", "prompts_per_step, mu and max_new_tokens must be >= 1")
    if rl.minibatch_size < 1 or (rl.prompts_per_step * rl.group_size) % rl.minibatch_size:
        bad("rl.minibatch_size", f"{rl.minibatch_size} must divide prompts_per_step x group_size = "
                                 f"{rl.prompts_per_step * rl.group_size}")
    if rl.loss_aggregation not in AGGREGATIONS:
        bad("rl.loss_aggregation", f"{rl.loss_aggregation!r} is not one of {', '.join(AGGREGATIONS)}")
    if rl.lr_schedule not in ("constant", "cosine"):
        bad("rl.lr_schedule", f"{rl.lr_schedule!r}: use 'constant' or 'cosine'")
    if not 0 <= rl.eps_low < 1 or rl.eps_high < 0:
        bad("rl.eps_low", "need 0 <= eps_low < 1 and eps_high >= 0")
    if rl.temperature <= 0:
        bad("rl.temperature", "rollouts need temperature > 0 for diverse groups")
    if c.checkpoint.save_every < 0 or c.checkpoint.keep < 1:
        bad("checkpoint", "save_every must be >= 0 (0 = only at the end) and keep >= 1")
    if c.eval.every < 0:
        bad("eval.every", "must be >= 0 (0 = only at start and end)")
    for name in ("policy", "grm", "drm"):
        if not getattr(c.models, name):
            bad(f"models.{name}", "empty; give a Hugging Face directory or 'toy'")
    if c.models.dtype not in ("float32", "bfloat16"):
        bad("models.dtype", f"{c.models.dtype!r}: use 'float32' or 'bfloat16'")
