"""GRPO with rewards from a generative reward model (RRC) or the DRM / PRC baselines: the main job.

    python -m rrc_jax.train --config=configs/agr.py [--config.workdir=DIR --config.steps=N ...]

Each step: B prompts (grain: shuffled, repeated, sharded per host, checkpointable) -> m rollouts each from the
policy -> rewards (`reward.kind`: DRM value head; PRC against the reference's greedy response; SCR round robin,
optionally CARA; AGR against stored anchors) -> group advantages (Eq. 4) -> `rl.mu` passes of minibatch AdamW
updates on the GRPO loss with a k3 KL to the frozen reference -> metrics (`workdir/metrics.jsonl`, TensorBoard)
-> Orbax checkpoints (resumed automatically). At the end the policy is exported to `workdir/hf_export/`.

On the toy world (`models.* = "toy"`, `data.path = "toy"`) the models are built on first use and cached in
`toy.cache_dir`, and `oracle_quality` (the task's true quality, Eq. 6) is logged for rollouts and, greedy, for
held-out prompts (`eval/oracle_quality`).
"""

from __future__ import annotations

import dataclasses
import math
import signal
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from rrc_jax import anchors as anchors_lib
from rrc_jax.checkpoint import Checkpointer
from rrc_jax.config import validate
from rrc_jax.data.prompts import PromptSet, load_prompts, prompt_batches
from rrc_jax.grpo import group_advantages, grpo_loss
from rrc_jax.judge import Judge, JudgeConfig
from rrc_jax.metrics import MetricsLogger
from rrc_jax.models import Decoder, load_hf, load_tokenizer, prompt_ids, save_hf
from rrc_jax.progress import Progress
from rrc_jax.rewards import agr_rewards, cara_rewards, prc_rewards, scr_diagnostics, scr_rewards
from rrc_jax.sampling import generate, length_bucket, pad_sequences
from rrc_jax.sft import sft_batch

CONFIG = config_flags.DEFINE_config_file("config", None, "Trainer config file, e.g. configs/agr.py.",
                                         lock_config=True)


@dataclasses.dataclass
class Setup:
    """Everything a run needs, built once from the config."""

    config: object
    policy: Decoder
    reference: Decoder | None  # frozen copy of the initial policy (KL, PRC references, anchors)
    tokenizer: object
    judge: Judge | None
    drm: Decoder | None
    train: PromptSet
    eval: PromptSet
    anchors: list[list[str]] | None = None
    eval_references: list[str] | None = None  # the reference policy's greedy eval responses (computed once)
    prc_references: dict[int, str] = dataclasses.field(default_factory=dict)  # prompt index -> greedy reference


def say(message: str) -> None:
    """A status line on stderr (process 0)."""
    if jax.process_index() == 0:
        print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------------
# Build
# ------------------------------------------------------------------------------------------------------------

def _model_dirs(config) -> dict[str, Path]:
    """Resolve "toy" model paths by building (or reusing) the toy world."""
    m = config.models
    names = {"policy": m.policy, "reference": m.reference or m.policy, "grm": m.grm, "drm": m.drm}
    world = None
    if "toy" in names.values():
        from rrc_jax.data.toy.world import ModelSpec, WorldSettings, build_world
        from rrc_jax.data.toy.task import SortTask

        t = config.toy
        settings = WorldSettings(
            task=SortTask(t.min_len, t.max_len, t.noise),
            policy=ModelSpec(hidden=64, layers=2, steps=t.policy_steps),
            grm=ModelSpec(hidden=96, layers=3, steps=t.grm_steps),
            drm=ModelSpec(hidden=64, layers=2, steps=t.drm_steps), seed=t.seed)
        world = build_world(settings, t.cache_dir)
    out = {}
    for role, path in names.items():
        p = getattr(world, "policy" if role == "reference" else role) if path == "toy" else Path(path).expanduser()
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"config.models.{role}: {p} is not a Hugging Face model directory "
                                    "(no config.json); give a local checkpoint directory or 'toy'")
        out[role] = p
    return out


def build(config, need_judge: bool = True) -> Setup:
    validate(config)
    dirs = _model_dirs(config)
    dtype = config.models.dtype
    policy = load_hf(dirs["policy"], dtype=dtype)
    tokenizer = load_tokenizer(dirs["policy"])
    kind = config.reward.kind
    # the reference serves the KL, PRC's greedy references, AGR's anchors and the judged eval win rate
    needs_ref = config.rl.beta > 0 or kind != "drm"
    reference = load_hf(dirs["reference"], dtype=dtype) if needs_ref else None
    judge = drm = None
    if kind == "drm":
        drm = load_hf(dirs["drm"], dtype=dtype, value_head=True)
    elif need_judge:
        r = config.reward
        judge = Judge(load_hf(dirs["grm"], dtype=dtype), load_tokenizer(dirs["grm"]), JudgeConfig(
            template=r.judge_template, max_new_tokens=r.judge_max_new_tokens, temperature=r.judge_temperature,
            max_batch=r.judge_max_batch, seed=config.seed))
    train_set, eval_set = load_prompts(config)
    return Setup(config, policy, reference, tokenizer, judge, drm, train_set, eval_set)


def anchors_path(config) -> Path:
    return Path(config.reward.anchors_path or Path(config.workdir) / "anchors.jsonl").expanduser()


def ensure_anchors(setup: Setup, force: bool = False, model: Decoder | None = None, seed: int = 0) -> None:
    """Load AGR anchors from `reward.anchors_path`, generating them with the reference policy when missing."""
    c = setup.config
    path = anchors_path(c)
    n = c.reward.n_anchors
    if force or not path.is_file():
        gen = generate_anchor_texts(setup, model or setup.reference or setup.policy, seed)
        if jax.process_index() == 0:
            anchors_lib.save_anchors(path, setup.train.ids, setup.train.texts, gen)
        say(f"wrote {len(gen)} x {n} anchors to {path}")
    setup.anchors = anchors_lib.load_anchors(path, setup.train.ids, setup.train.texts, n)


def generate_anchor_texts(setup: Setup, model: Decoder, seed: int) -> list[list[str]]:
    c = setup.config
    return anchors_lib.generate_anchors(model, setup.tokenizer, setup.train.texts, c.reward.n_anchors,
                                        max_new_tokens=c.rl.max_new_tokens, temperature=c.rl.temperature,
                                        top_p=c.rl.top_p, seed=seed)


# ------------------------------------------------------------------------------------------------------------
# One step
# ------------------------------------------------------------------------------------------------------------

def rollouts(setup: Setup, prompts: list[str], key: jax.Array) -> tuple[list[list[str]], dict[str, np.ndarray]]:
    """m sampled responses per prompt: texts `[B][m]` and the training batch (prompt + response rows, right-padded,
    `loss_mask` over response tokens including the stop token)."""
    c, m = setup.config, setup.config.rl.group_size
    ids = [prompt_ids(setup.tokenizer, p) for p in prompts]
    rows = [ids[i] for i in range(len(prompts)) for _ in range(m)]
    out = generate(setup.policy, ids, max_new_tokens=c.rl.max_new_tokens, rng=key, temperature=c.rl.temperature,
                   top_p=c.rl.top_p, group_size=m)
    responses = [out.tokens[r, :out.lengths[r]].tolist() for r in range(len(rows))]
    texts = anchors_lib.decode_responses(setup.tokenizer, out.tokens, out.lengths)
    length = length_bucket(max(len(p) + len(r) for p, r in zip(rows, responses)))  # few shapes, few compiles
    batch = sft_batch(rows, responses, length, setup.policy.cfg.pad_token_id or 0)
    batch["truncated"] = out.truncated
    return [texts[i * m:(i + 1) * m] for i in range(len(prompts))], batch


def rewards(setup: Setup, prompts: list[str], responses: list[list[str]], prompt_index: np.ndarray
            ) -> tuple[np.ndarray, dict[str, float]]:
    """Rewards `[B, m]` of the configured kind, and reward-side metrics."""
    r = setup.config.reward
    b, m = len(prompts), len(responses[0])
    metrics: dict[str, float] = {}
    if r.kind == "drm":
        rows = [prompt_ids(setup.tokenizer, p) + setup.tokenizer(o, add_special_tokens=False)["input_ids"]
                + [int(setup.tokenizer.eos_token_id)] for p, group in zip(prompts, responses) for o in group]
        ids, mask = pad_sequences(rows, length_bucket(max(map(len, rows))), setup.drm.cfg.pad_token_id or 0, "right")
        graphdef, state = nnx.split(setup.drm)
        return np.asarray(_values(graphdef, state, jnp.asarray(ids), jnp.asarray(mask))).reshape(b, m), metrics
    judge = setup.judge
    judge.reset_metrics()
    if r.kind == "prc":
        ref_texts = prc_references(setup, prompt_index)
        p_a = judge.preference_prob([p for p in prompts for _ in range(m)], [o for g in responses for o in g],
                                    [t for t in ref_texts for _ in range(m)], think=r.prc_think)
        out = np.asarray(prc_rewards(p_a.reshape(b, m)))
        metrics["reward/prc_saturation"] = float(np.mean((p_a <= 0.1) | (p_a >= 0.9)))
    elif r.kind == "scr":
        counts = judge.round_robin(prompts, responses, votes=r.votes, swap=r.swap)
        diag = scr_diagnostics(counts, votes=r.votes)
        metrics.update({f"judge/{k}": float(np.mean(v)) for k, v in diag.items()})
        out = (cara_rewards(counts, alpha=r.alpha, method=r.cara_method) if r.cara
               else np.asarray(scr_rewards(counts, alpha=r.alpha, ties=r.ties)))
    else:  # agr
        anchors = [setup.anchors[i] for i in prompt_index]
        wins, losses = judge.vs_anchors(prompts, responses, anchors, votes=r.votes, swap=r.swap)
        out = np.asarray(agr_rewards(wins, losses, alpha=r.alpha, ties=r.ties))
        decided = wins != losses
        metrics["judge/tie_fraction"] = float(1 - decided.mean())
    s = judge.metrics.summary()
    metrics.update({"judge/questions": s["questions"], "judge/tokens": s["judge_tokens"],
                    "judge/abstain_rate": s["abstain_rate"], "judge/position_consistency": s["position_consistency"],
                    "judge/prefill_tokens_saved": s["prefill_tokens_saved"]})
    return np.asarray(out, np.float32), metrics


def prc_references(setup: Setup, prompt_index: np.ndarray) -> list[str]:
    """The frozen reference policy's greedy response to each prompt (PRC's o_ref, Eq. 5), generated once per prompt
    and cached."""
    todo = sorted({int(i) for i in prompt_index} - setup.prc_references.keys())
    if todo:
        out = generate(setup.reference, [prompt_ids(setup.tokenizer, setup.train.texts[i]) for i in todo],
                       max_new_tokens=setup.config.rl.max_new_tokens, temperature=0.0)
        texts = anchors_lib.decode_responses(setup.tokenizer, out.tokens, out.lengths)
        setup.prc_references.update(zip(todo, texts))
    return [setup.prc_references[int(i)] for i in prompt_index]


def _loss(model: Decoder, batch, old_logp, ref_logp, adv, hp):
    logp, entropy = model.token_logprobs(batch["ids"], batch["mask"], return_entropy=True)
    loss, metrics = grpo_loss(logp, old_logp, ref_logp, adv, batch["loss_mask"], eps_low=hp["eps_low"],
                              eps_high=hp["eps_high"], beta=hp["beta"], aggregation=hp["aggregation"])
    w = batch["loss_mask"].astype(jnp.float32)
    metrics["entropy"] = (entropy * w).sum() / jnp.maximum(w.sum(), 1.0)
    return loss, metrics


@nnx.jit(static_argnames=("aggregation",))
def _grads(model, batch, old_logp, ref_logp, adv, eps_low, eps_high, beta, aggregation):
    hp = dict(eps_low=eps_low, eps_high=eps_high, beta=beta, aggregation=aggregation)
    (loss, metrics), grads = nnx.value_and_grad(_loss, has_aux=True)(model, batch, old_logp, ref_logp, adv, hp)
    finite = jnp.isfinite(loss) & jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
    return loss, metrics, grads, finite


@nnx.jit
def _apply(model, optimizer, grads):
    optimizer.update(model, grads)


@jax.jit
def _token_logprobs(graphdef, state, ids, mask):
    return nnx.merge(graphdef, state).token_logprobs(ids, mask)


@jax.jit
def _values(graphdef, state, ids, mask):
    return nnx.merge(graphdef, state).values(ids, mask)


def logprobs_of(model: Decoder, batch) -> jax.Array:
    graphdef, state = nnx.split(model)
    return _token_logprobs(graphdef, state, jnp.asarray(batch["ids"]), jnp.asarray(batch["mask"]))


def update(setup: Setup, optimizer: nnx.Optimizer, batch, adv: np.ndarray, key: jax.Array) -> dict[str, float]:
    """`rl.mu` passes of minibatch updates over one step's rollouts; a non-finite loss or gradient skips that
    update (counted in `skipped_updates`)."""
    rl = setup.config.rl
    data = {k: jnp.asarray(batch[k]) for k in ("ids", "mask", "loss_mask")}
    old = logprobs_of(setup.policy, data)  # pi_theta_old, recomputed with the training numerics
    ref = logprobs_of(setup.reference, data) if rl.beta > 0 else None
    adv = jnp.asarray(adv)
    n = data["ids"].shape[0]
    logs, skipped = [], 0
    for epoch in range(rl.mu):
        order = np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), n))
        for start in range(0, n, rl.minibatch_size):
            idx = order[start:start + rl.minibatch_size]
            mb = {k: v[idx] for k, v in data.items()}
            loss, metrics, grads, finite = _grads(setup.policy, mb, old[idx], None if ref is None else ref[idx],
                                                  adv[idx], rl.eps_low, rl.eps_high, rl.beta, rl.loss_aggregation)
            if bool(finite):
                _apply(setup.policy, optimizer, grads)
            else:
                skipped += 1
            logs.append({k: float(v) for k, v in {"loss": loss, **metrics}.items()})
    out = {k: float(np.mean([l[k] for l in logs])) for k in logs[0]}  # NaN shows a skipped update
    out["skipped_updates"] = skipped
    return out


def oracle(setup: Setup, prompt_index: np.ndarray, texts: list[list[str]], split: str = "train") -> np.ndarray | None:
    """Toy oracle quality `[B, m]` of responses (None when the prompts are not the toy task's)."""
    prompts = setup.train if split == "train" else setup.eval
    if prompts.oracle is None:
        return None
    return np.array([[prompts.oracle(int(i), t) for t in group] for i, group in zip(prompt_index, texts)])


def evaluate(setup: Setup) -> dict[str, float]:
    """Greedy responses on held-out prompts: toy oracle quality (mean and standard error); with a judge, the win
    rate against the reference policy's greedy responses."""
    ev = setup.eval
    ids = [prompt_ids(setup.tokenizer, p) for p in ev.texts]
    n_new = setup.config.rl.max_new_tokens
    out = generate(setup.policy, ids, max_new_tokens=n_new, temperature=0.0)
    texts = anchors_lib.decode_responses(setup.tokenizer, out.tokens, out.lengths)
    metrics: dict[str, float] = {"eval/response_length": float(out.lengths.mean())}
    if ev.oracle is not None:
        q = np.array([ev.oracle(i, t) for i, t in enumerate(texts)])
        metrics["eval/oracle_quality"] = float(q.mean())
        metrics["eval/oracle_quality_se"] = float(q.std(ddof=1) / math.sqrt(len(q)))
    if setup.judge is not None and setup.reference is not None:
        if setup.eval_references is None:
            ref = generate(setup.reference, ids, max_new_tokens=n_new, temperature=0.0)
            setup.eval_references = anchors_lib.decode_responses(setup.tokenizer, ref.tokens, ref.lengths)
        v = setup.config.eval.judge_votes
        pv = setup.judge.compare(ev.texts, texts, setup.eval_references, votes=v, swap=True)
        decided = np.maximum(pv.wins + pv.losses, 1)
        metrics["eval/win_rate_vs_reference"] = float(np.mean((pv.wins + 0.5 * (v - pv.wins - pv.losses)) / v))
        metrics["eval/decided_win_rate_vs_reference"] = float(np.mean(pv.wins / decided))
    return metrics


# ------------------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------------------

def make_optimizer(setup: Setup) -> nnx.Optimizer:
    rl = setup.config.rl
    if rl.lr_schedule == "cosine":
        lr = optax.warmup_cosine_decay_schedule(0.0, rl.learning_rate, max(rl.warmup_steps, 1),
                                                max(setup.config.steps * rl.mu * _updates_per_pass(setup), 2))
    else:
        lr = (optax.linear_schedule(0.0, rl.learning_rate, rl.warmup_steps) if rl.warmup_steps
              else rl.learning_rate)
    tx = optax.chain(optax.clip_by_global_norm(rl.grad_clip), optax.adamw(lr, weight_decay=0.0))
    return nnx.Optimizer(setup.policy, tx, wrt=nnx.Param)


def _updates_per_pass(setup: Setup) -> int:
    rl = setup.config.rl
    return rl.prompts_per_step * rl.group_size // rl.minibatch_size


def run(config) -> Path:
    """Train per `config`; returns the workdir."""
    workdir = Path(config.workdir).expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    setup = build(config)
    if config.reward.kind == "agr":
        ensure_anchors(setup)
    optimizer = make_optimizer(setup)
    batches = prompt_batches(config, len(setup.train.texts))
    ckpt = Checkpointer(workdir / "checkpoints", save_every=config.checkpoint.save_every, keep=config.checkpoint.keep)
    start = 0
    if ckpt.latest_step() is not None:
        start = ckpt.restore(setup.policy, optimizer, batches)
        say(f"resumed from the checkpoint of step {start} in {ckpt.directory}")
    elif config.init_from:
        Checkpointer(Path(config.init_from).expanduser()).restore_params(setup.policy)
        say(f"initialized the policy from {config.init_from}")
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")
    logger = MetricsLogger(workdir)
    key = jax.random.key(config.seed)
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    try:
        if start == 0:
            logger.log(0, evaluate(setup))
        with Progress(config.steps, "train", start=start) as bar:
            for step in range(start + 1, config.steps + 1):
                metrics = train_step(setup, optimizer, batches, jax.random.fold_in(key, step), step)
                if config.eval.every and step % config.eval.every == 0 or step == config.steps:
                    metrics.update(evaluate(setup))
                logger.log(step, metrics)
                bar.update(1, reward=metrics["reward/mean"], **({"oracle": metrics["oracle_quality"]}
                                                                 if "oracle_quality" in metrics else {}))
                saved = ckpt.maybe_save(step, setup.policy, optimizer, batches, force=step == config.steps)
                if interrupted:
                    if not saved:
                        ckpt.maybe_save(step, setup.policy, optimizer, batches, force=True)
                    ckpt.wait()
                    say(f"interrupted: checkpoint of step {step} saved in {ckpt.directory}")
                    sys.exit(130)
        ckpt.wait()
        save_hf(setup.policy, workdir / "hf_export", tokenizer=setup.tokenizer)
        say(f"exported the policy to {workdir / 'hf_export'}")
    finally:
        signal.signal(signal.SIGINT, previous)
        logger.close()
        ckpt.close()
    return workdir


def train_step(setup: Setup, optimizer: nnx.Optimizer, batches, key: jax.Array, step: int) -> dict[str, float]:
    c = setup.config
    t0 = time.perf_counter()
    prompt_index = next(batches)
    prompts = [setup.train.texts[i] for i in prompt_index]
    r_every = c.reward.anchor_refresh_every
    if c.reward.kind == "agr" and r_every and step > 1 and (step - 1) % r_every == 0:
        ensure_anchors(setup, force=True, model=setup.policy, seed=step)  # the review's suggestion 9(c)3
    texts, batch = rollouts(setup, prompts, jax.random.fold_in(key, 0))
    t1 = time.perf_counter()
    if setup.judge is not None:
        setup.judge.reseed(c.seed * 1_000_003 + step)
    r, metrics = rewards(setup, prompts, texts, prompt_index)
    t2 = time.perf_counter()
    adv = np.asarray(group_advantages(r)).reshape(-1)
    metrics.update(update(setup, optimizer, batch, adv, jax.random.fold_in(key, 1)))
    t3 = time.perf_counter()
    n_resp = int(batch["loss_mask"].sum())
    metrics.update({
        "reward/mean": float(r.mean()), "reward/std": float(r.std(axis=1).mean()),
        "response_length": float(batch["loss_mask"].sum(1).mean()),
        "truncated_fraction": float(np.mean(batch["truncated"])),
        "time/rollout": t1 - t0, "time/judge": t2 - t1, "time/update": t3 - t2,
        "tokens_per_second": n_resp / max(t1 - t0, 1e-9),
    })
    q = oracle(setup, prompt_index, texts)
    if q is not None:
        metrics["oracle_quality"] = float(q.mean())
    return metrics


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/agr.py")
    if not flags.FLAGS["verbosity"].present:  # Orbax logs every save at INFO; keep the terminal for progress
        logging.set_verbosity(logging.WARNING)
    try:
        run(CONFIG.value)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    app.run(main)
