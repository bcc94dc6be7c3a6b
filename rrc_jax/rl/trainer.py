"""The GRPO training loop. It sees a Sampler (the policy), a reward construction and a Learner, nothing below them.

One step (`Trainer.step`):

1. B prompt indices from the grain pipeline (shuffled, repeated, sharded per host, checkpointable);
2. m rollouts per prompt from the policy sampler (`rrc_jax.rl.rollout.sample_groups`, `RolloutConfig`);
3. rewards `[B, m]` from the reward construction (`reward.kind`, `rrc_jax.constructions`), with its metrics and, on
   the steps that dump samples, the judgments behind them, plus DAPO's overlong penalty (`rl.overlong`); under
   `rl.dynamic_sampling`, 1-3 again until B groups have rewards that are not all equal
   (`rrc_jax.rl.dynamic_sampling`);
4. group advantages (`rl.advantage`: Eq. 4, Dr.GRPO's or RLOO's);
5. log-probabilities of the rollouts under the policy before the update (pi_theta_old; not computed when each
   rollout gets exactly one update, `rl.mu = 1` with one minibatch per step: that update is on-policy) and, with
   `rl.beta > 0`, under the frozen reference, all at the sampling temperature; then `rl.mu` passes of minibatch updates of the
   GRPO loss by the learner (one jitted, donated step each; non-finite updates skipped and counted);
6. metrics, read back from the device once; on `log.samples_every` steps (and step 1) a few prompts' responses,
   rewards, advantages and judgments to `workdir/samples/step_N.jsonl` (`rrc_jax.rl.samples`); alarms when the
   step carried no signal (`rrc_jax.rl.alarms`).

With `rl.max_staleness = k >= 1` (`rrc_jax.rl.pipeline`, `Trainer.pipelined`), 1-3 of step t + k run during step t:
its batch is sampled with the weights of t - 1 updates, its behaviour log-probs recorded (the ratio of 5 is against
them), and it is judged on a worker thread while steps t and t + 1 sample and learn.

The command line's config is parsed once (`rrc_jax.config.validate`) into each component's settings
(`TrainerSettings`: the rollout, the learner, the objective, the guard, the mesh, the prompts, the judge, the reward
construction's class); each piece goes to the code that reads it. `Trainer.run` adds evaluation (step 0, every
`eval.every` steps and the last), metrics files, Orbax checkpoints (resumed automatically; Ctrl-C or SIGTERM, how
Cloud TPU preempts a VM, saves one after the current step and exits), and the Hugging Face export of the final policy.

On several hosts (`rrc_jax.distributed`) every host runs this loop on its own share of the step: it reads its own
shard of the prompt indices (grain), tokenizes its own prompts, detokenizes its own rollouts, judges its own groups
(their questions, rewards and advantages; CARA too) and scores its own eval prompts, while every model call runs as
one program over the global mesh, fed with each host's rows (`sharding.put_rows`) and read back per host
(`sharding.host_rows`). Metrics are reduced across hosts (`distributed.reduce_metrics`); only process 0 writes
files.
"""

from __future__ import annotations

import contextlib
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx

from rrc_jax import distributed, fault_points
from rrc_jax.checkpoint import Checkpointer, CheckpointWriteError, StopSignals, base_hash
from rrc_jax.compiles import CompileLap
from rrc_jax.config import TrainerSettings
from rrc_jax.constructions import RewardContext, make_construction
from rrc_jax.data.prompts import PromptSet, check_toy_eval_prompts, load_prompts, prompt_batches, prompt_token_limit
from rrc_jax.errors import ConfigError
from rrc_jax.inference.factory import make_sampler
from rrc_jax.workdir import WorkdirLock, check_resume, config_hash, save_config
from rrc_jax.metrics import MetricsLogger
from rrc_jax.models import save_hf
from rrc_jax.models.peft_io import save_adapter
from rrc_jax.plan import judge_rows_choice, remat_choice
from rrc_jax.progress import Progress, say
from rrc_jax.rl.held_out import held_out_metrics
from rrc_jax.rl.alarms import Alarms, config_warnings, signal_metrics
from rrc_jax.rl.fidelity import fidelity_metrics
from rrc_jax.rl.dynamic_sampling import Draw, fill
from rrc_jax.rl.grpo import group_advantages, grpo_objective, overlong_penalty
from rrc_jax.rl.guard import DivergenceGuard
from rrc_jax.rl.learner import Learner, learning_rate_schedule, make_optimizer, token_logprobs
from rrc_jax.rl.pipeline import Backlog, Pipeline, Sampled, in_flight_steps, overlap_refusal, staleness_metrics
from rrc_jax.rl.rollout import Groups, sample_groups
from rrc_jax.rl.roles import Roles
from rrc_jax.rl.samples import sample_records, samples_due, write_samples
from rrc_jax.sharding import bytes_per_device, constrain, host_row_multiple, host_rows, put_rows


@jax.jit
def take_rows(batch: dict, rows: jax.Array) -> dict:
    """The minibatch `rows [R]` of a batch of `[N, ...]` arrays, its rows over `(data, fsdp)` again."""
    return {k: constrain(v[rows], ("batch",) + (None,) * (v.ndim - 1)) for k, v in batch.items()}


@functools.partial(jax.jit, static_argnums=1)
def row_seeds(key: jax.Array, n: int) -> jax.Array:
    """`[n]` uint32 seeds from `key`, one per row of a step's batch, its rows over `(data, fsdp)`."""
    return constrain(jax.random.bits(key, (n,), jnp.uint32), ("batch",))


class Trainer:
    """GRPO per a trainer config's `settings` (`rrc_jax.config.validate`): builds the roles it needs, the policy
    sampler, the reward construction and the learner."""

    def __init__(self, settings: TrainerSettings):
        self.mesh = settings.mesh.make()
        slices = len(settings.mesh.slices(list(self.mesh.devices.flat)))
        if slices > 1:
            say(f"mesh: {dict(self.mesh.shape)} over {slices} slices, mesh.dcn={settings.mesh.dcn} across them: "
                "gradients reduce over the data-center network, rows and tensor stay inside a slice")
        if settings.judge.fill_memory:
            settings, why = judge_rows_choice(settings, self.mesh)
            say(f"reward.judge.fill_memory: {why}")
        self.settings = settings
        with jax.set_mesh(self.mesh):
            self._build()

    def _build(self) -> None:
        s = self.settings
        rollout, learner, grpo = s.rollout, s.learner, s.grpo
        self.workdir = epath.Path(s.workdir).expanduser()
        s.reward.preflight(s)  # (a reward service answering with the run's recipe) before any model loads
        self.roles = Roles.of_run(s, self.mesh)
        self.policy = self.roles.model("policy")
        self.tokenizer = self.roles.tokenizer("policy")
        self.sampler = make_sampler("policy", self.policy, self.tokenizer, engine=s.inference,
                                    max_batch=rollout.max_batch,  # its rollout copy, unless the weights are shared
                                    layout=None if rollout.share_weights else self.roles.layout("policy", "inference"))
        self.train_prompts, self.eval_prompts = training_prompts(s, self.roles)
        self.context = RewardContext(s, self.roles, self.sampler, self.tokenizer, self.train_prompts)
        self.reward = make_construction(s, self.context)
        schedule = learning_rate_schedule(learner.learning_rate, curve=learner.lr_schedule,
                                          warmup_steps=learner.warmup_steps,
                                          total_steps=learner.updates(rollout.rows, s.steps))
        eps_low, eps_high = grpo.clip_range
        remat, why = remat_choice(s, self.mesh)
        if learner.remat is None:
            say(f"rl.remat: {why}")
        self.learner = Learner(self.policy, make_optimizer(schedule, grad_clip=learner.grad_clip), grpo_objective(
            temperature=rollout.temperature, eps_low=eps_low, eps_high=eps_high, beta=grpo.beta,
            aggregation=grpo.loss_aggregation, max_len=rollout.max_new_tokens, chunk_size=learner.logprob_chunk,
            remat=remat, loss=grpo.loss), micro_batch_size=learner.micro_batch_size)
        self.batches = prompt_batches(rollout.prompts_per_step, s.seed, len(self.train_prompts.texts),
                                      paired=self.train_prompts.paired)
        if rollout.prompts_per_step > len(self.train_prompts.texts):
            say(f"warning: rl.prompts_per_step={rollout.prompts_per_step} but the training set holds "
                f"{len(self.train_prompts.texts)} prompts: prompts repeat within a step (their groups are judged and "
                "learned from twice); lower rl.prompts_per_step or give more prompts")
        rows = rollout.prompts_per_step // jax.process_count() * rollout.group_size
        multiple = host_row_multiple(self.mesh)
        if rows % multiple:
            raise ConfigError(f"config.rl: each of the {jax.process_count()} hosts trains on prompts_per_step / hosts x "
                              f"group_size = {rows} rollouts, which must be a multiple of {multiple} (the batch shards "
                              "on its devices); change rl.prompts_per_step or the mesh")
        self.alarms = Alarms(s.alarms.abstain_alarm, s.alarms.flat_alarm_steps, str(self.workdir))
        self.pipeline, k = None, s.pipeline.max_staleness
        self.backlog = None if k else Backlog(self.batches)  # (a checkpoint's batches sampled ahead at k >= 1)
        if k:
            inline = overlap_refusal(s, self.mesh)
            if inline:
                say(f"rl.max_staleness={k}: the reward runs on the trainer's thread ({inline}): the steps keep their "
                    "staleness, judging does not overlap them")
            self.pipeline = Pipeline(k, self.batches, self.rewarded, inline=inline, mesh=self.mesh)
        for warning in config_warnings(s.judge, s.eval.judge_votes, "grm" in s.reward_roles):
            say(warning)

    def memory(self) -> dict[str, int]:
        """Bytes per device (the most on any device) of the loaded models' parameters and of the optimizer state,
        from the live arrays' shards."""
        params = {role: nnx.state(self.roles.model(role), nnx.Param) for role in self.roles.loaded}
        out = {f"memory/{role}_params_bytes_per_device": bytes_per_device(p) for role, p in params.items()}
        out["memory/params_bytes_per_device"] = bytes_per_device(params)
        out["memory/optimizer_bytes_per_device"] = bytes_per_device(self.learner.opt_state)
        return out

    def data_counts(self) -> dict[str, int]:
        """What loading the prompts dropped or skipped (`data/*` training, `data/eval_*` held-out)."""
        return {**{f"data/{k}": v for k, v in self.train_prompts.counts.items()},
                **{f"data/eval_{k}": v for k, v in self.eval_prompts.counts.items()}}

    def system(self) -> dict[str, int]:
        """The processes (hosts) and devices the run's mesh spans."""
        return {"system/processes": jax.process_count(), "system/devices": self.mesh.size}

    # -- one step ----------------------------------------------------------------------------------------

    def update(self, batch: dict[str, np.ndarray], advantages: np.ndarray, key: jax.Array, step: int = 0
               ) -> dict[str, float]:
        """`rl.mu` passes of minibatch updates over one step's rollouts (every host's rows of `batch` and
        `advantages [B*m]`); metrics are means over the updates (NaN shows a skipped one), `skipped_updates` their
        count. `step`: the step they are (a fault point names it)."""
        learner, beta = self.settings.learner, self.settings.grpo.beta
        data = put_rows({**{k: batch[k] for k in ("ids", "mask", "loss_mask", "old_logp") if k in batch},
                          "advantages": np.asarray(advantages, np.float32)}, self.mesh)
        logprobs = lambda model: self.logprobs(model, data)
        n, size = data["ids"].shape[0], learner.minibatch_size
        if "old_logp" not in data and (learner.mu > 1 or size < n):  # (sampled ahead: the behaviour policy's)
            data["old_logp"] = logprobs(self.policy)  # else each rollout's one update is on-policy (grpo_objective)
        if beta > 0:
            data["ref_logp"] = logprobs(self.roles.model("reference"))
        logs = []
        for epoch in range(learner.mu):
            order = np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), n))
            if self.settings.lora.dropout:  # each row's LoRA dropout seed in this pass, whatever its minibatch
                data["dropout_seed"] = row_seeds(jax.random.fold_in(key, learner.mu + epoch), n)
            for start in range(0, n, size):
                logs.append(self.learner.update(take_rows(data, jnp.asarray(order[start:start + size]))))
                fault_points.reached("update", step)
        logs = jax.device_get(logs)  # the step's one read-back
        out = {k: float(np.mean([log[k] for log in logs])) for k in logs[0] if k != "skipped"}
        out["skipped_updates"] = int(sum(log["skipped"] for log in logs))
        start = time.perf_counter()
        moved = self.sampler.update_weights(self.learner.params)  # the rollout samples the updated policy next
        out["time/weight_sync"] = time.perf_counter() - start
        out["memory/weight_sync_bytes_per_device"] = moved
        return out

    def logprobs(self, model, data: dict) -> jax.Array:
        """`[N, T]` token log-probabilities of the rows `data` (`ids`, `mask` on the mesh) under `model`, at the
        sampling temperature."""
        rollout, learner = self.settings.rollout, self.settings.learner
        return token_logprobs(model, data["ids"], data["mask"], rollout.temperature,
                              micro_batch_size=learner.micro_batch_size, chunk_size=learner.logprob_chunk)

    def behaviour(self, groups: Groups, version: int) -> Groups:
        """`groups` with their behaviour policy: their token log-probabilities under the current weights, which
        sampled them (`version` optimizer steps taken)."""
        batch = groups.batch(self.sampler.pad_id)
        logp = host_rows(self.logprobs(self.policy, put_rows({k: batch[k] for k in ("ids", "mask")}, self.mesh)),
                         self.mesh)
        return groups.with_behaviour(logp, batch["loss_mask"], version)

    def sample(self, step: int, key: jax.Array, version: int | None = None) -> Sampled:
        """The next B prompts of the pipeline and m rollouts of each (sampled from `key`) for step `step`; with
        `version` (sampled ahead, `rl.max_staleness > 0`), their behaviour policy and what the reward reads beside
        them (`Construction.prepare`), prepared now."""
        t0 = time.perf_counter()
        prompt_index = next(self.batches)  # [B]: this host's shard
        prompts = [self.train_prompts.texts[i] for i in prompt_index]
        groups = sample_groups(self.sampler, self.tokenizer, self.train_prompts, prompts, self.settings.rollout, key)
        if version is not None:
            groups = self.behaviour(groups, version)
        seconds = time.perf_counter() - t0
        inputs = None if version is None else self.reward.prepare(prompts, prompt_index, step)
        return Sampled(prompt_index, prompts, groups, inputs, seconds, int(groups.lengths.sum()))

    def rewarded(self, sampled: Sampled, step: int, trace: bool) -> Draw:
        """`sampled`'s rewards at step `step`: the construction's, plus DAPO's overlong penalty (`rl.overlong`)."""
        rollout, grpo, groups = self.settings.rollout, self.settings.grpo, sampled.groups
        t1 = time.perf_counter()
        result = self.reward(sampled.prompts, groups.texts, sampled.prompt_index, step, trace=trace,
                             inputs=sampled.inputs)
        shaped = result.rewards + overlong_penalty(groups.lengths, rollout.max_new_tokens, grpo.overlong,
                                                   grpo.overlong_penalty)
        return Draw(sampled.prompt_index, sampled.prompts, groups, result, shaped, sampled.rollout_seconds,
                    time.perf_counter() - t1, sampled.sampled_tokens)

    def draw(self, step: int, key: jax.Array, trace: bool) -> Draw:
        """The next B prompts of the pipeline, m rollouts of each (sampled from `key`) and their rewards."""
        return self.rewarded(self.sample(step, key), step, trace)

    def step_key(self, step: int) -> jax.Array:
        """Step `step`'s key: every random draw of the step derives from it."""
        return jax.random.fold_in(jax.random.key(self.settings.seed), step)

    def draw_key(self, step: int, i: int = 0) -> jax.Array:
        """The key draw `i` of step `step` samples from (i > 0: dynamic sampling's further draws)."""
        key = self.step_key(step)
        return jax.random.fold_in(jax.random.fold_in(key, 2), i) if i else jax.random.fold_in(key, 0)

    def launch(self, step: int, version: int) -> None:
        """Sample step `step`'s batch now, with the weights of `version` updates, and hand it to the judge."""
        with self.pipeline.phase("rollout", step):
            sampled = self.sample(step, self.draw_key(step), version)
        self.pipeline.put(step, sampled, self.dumps(step))

    def dumps(self, step: int) -> bool:
        """Whether this process writes step `step`'s samples (and its judgments are traced)."""
        return samples_due(step, self.settings.samples.samples_every) and distributed.is_main()

    def pipelined(self, step: int, dump: bool) -> tuple[Draw, dict[str, float]]:
        """Step `step`'s batch under `rl.max_staleness = k` (`rrc_jax.rl.pipeline`): batch step + k sampled and
        handed to the judge, then batch `step`'s rewards (dynamic sampling: drawn further now); its staleness and
        the phases' seconds."""
        p, rollout = self.pipeline, self.settings.rollout
        if step + p.k <= self.settings.steps and step + p.k not in p.sampled:  # (in flight: a resume at a smaller k)
            self.launch(step + p.k, version=step - 1)
        t0 = time.perf_counter()
        first = p.take(step)
        if rollout.dynamic_sampling:
            drawn, counts = fill(lambda i: first if i == 0 else p.judge_now(
                self.sample(step, self.draw_key(step, i), version=step - 1), step, dump), rollout.max_draws)
        else:
            drawn, counts = first, {}
        judge_busy = p.judge_clock.lap()
        return drawn, {**counts, **staleness_metrics(drawn.groups, step), "time/learner_wait": time.perf_counter() - t0,
                       "time/judge_busy": judge_busy}

    def caught_up(self, step: int, sampled: Sampled, dump: bool) -> tuple[Draw, dict[str, float]]:
        """Step `step`'s batch at k = 0 when the checkpoint it resumed, written at k >= 1, held it in flight
        (`sampled`, `rrc_jax.rl.pipeline.Backlog`): its rewards (dynamic sampling: drawn further now, with their
        behaviour policy, as the asynchronous step draws) and its staleness."""
        rollout, first = self.settings.rollout, self.rewarded(sampled, step, dump)
        if rollout.dynamic_sampling:
            drawn, counts = fill(lambda i: first if i == 0 else self.rewarded(
                self.sample(step, self.draw_key(step, i), version=step - 1), step, dump), rollout.max_draws)
        else:
            drawn, counts = first, {}
        return drawn, {**counts, **staleness_metrics(drawn.groups, step)}

    def step(self, step: int) -> dict[str, float]:
        """One GRPO step (module docstring); returns its metrics, reduced across hosts."""
        started = time.perf_counter()
        key = self.step_key(step)
        rollout = self.settings.rollout
        dump = self.dumps(step)
        ahead = self.backlog.take(step) if self.backlog is not None else None
        if self.pipeline is not None:
            drawn, counts = self.pipelined(step, dump)
        elif ahead is not None:
            drawn, counts = self.caught_up(step, ahead, dump)
        elif rollout.dynamic_sampling:  # draw i > 0 samples from its own key
            drawn, counts = fill(lambda i: self.draw(step, self.draw_key(step, i), dump), rollout.max_draws)
        else:
            drawn, counts = self.draw(step, self.draw_key(step), dump), {}
        prompt_index, prompts, texts, result, rewards = (drawn.prompt_index, drawn.prompts, drawn.groups.texts,
                                                         drawn.result, drawn.rewards)
        batch = drawn.groups.batch(self.sampler.pad_id)
        advantages = np.asarray(group_advantages(rewards, self.settings.grpo.advantage))
        metrics = {**result.metrics, **signal_metrics(rewards), **counts}
        if self.settings.grpo.overlong:
            metrics["reward/overlong_penalty"] = float((rewards - result.rewards).mean())
        t2 = time.perf_counter()
        with self.pipeline.phase("update", step) if self.pipeline else contextlib.nullcontext():
            metrics.update(self.update(batch, advantages.reshape(-1), jax.random.fold_in(key, 1), step))
        metrics.update({
            "reward/mean": float(result.rewards.mean()), "reward/std": float(result.rewards.std(axis=1).mean()),
            "response_length": float(batch["loss_mask"].sum(1).mean()),
            "truncated_fraction": float(np.mean(batch["truncated"])),
            "time/rollout": drawn.rollout_seconds, "time/reward": drawn.reward_seconds,
            "time/update": time.perf_counter() - t2,
            "tokens_per_second": drawn.sampled_tokens / max(drawn.rollout_seconds, 1e-9),
        })
        quality = None
        if self.train_prompts.oracle is not None:
            oracle = self.train_prompts.oracle
            quality = np.array([[oracle(int(i), t) for t in group] for i, group in zip(prompt_index, texts)])
            metrics["oracle_quality"] = float(quality.mean())
            metrics.update(fidelity_metrics(rewards, quality))  # how the rewards rank and weigh vs the oracle
        if dump:
            write_samples(self.workdir, step, sample_records(
                step, prompts, prompt_index, texts, rewards, advantages, judgments=result.judgments,
                notes=result.notes, quality=quality,
                limit=self.settings.samples.samples_prompts))
        if self.pipeline is not None:  # the judge's idle seconds: the step's less its busy ones
            metrics["time/step"] = time.perf_counter() - started
            metrics["time/judge_idle"] = max(0.0, metrics["time/step"] - metrics["time/judge_busy"])
        metrics = distributed.reduce_metrics(metrics)
        self.alarms.check(step, metrics)
        return metrics

    # -- evaluation --------------------------------------------------------------------------------------

    def evaluate(self, step: int) -> dict[str, float]:
        """The held-out metrics at `step` (`rrc_jax.rl.held_out.held_out_metrics`)."""
        return held_out_metrics(self.sampler, self.tokenizer, self.eval_prompts, self.reward,
                                self.settings.rollout.greedy, step)

    # -- the loop ----------------------------------------------------------------------------------------

    def run(self) -> epath.Path:
        """Train for `settings.steps` steps (resuming from the latest checkpoint in the workdir); returns it."""
        with jax.set_mesh(self.mesh):
            return self._run()

    def _run(self) -> epath.Path:
        s, workdir = self.settings, self.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        ckpt = Checkpointer(workdir / "checkpoints", save_every=s.checkpoint.save_every, keep=s.checkpoint.keep,
                            record=s.record, config_hash=config_hash(s.record),
                            model_hash=base_hash(self.policy) if s.lora.enabled else "")
        data = self.backlog if self.pipeline is None else self.pipeline  # the prompts, and the batches in flight
        start = ckpt.resume(self.learner, data)
        if start:
            self.sampler.update_weights(self.learner.params)  # the rollout copy of the restored policy
        if self.backlog is not None and self.backlog.ahead:
            held = ", ".join(str(t) for t in sorted(self.backlog.ahead))
            say(f"rl.max_staleness=0: the checkpoint of step {start} held batches {held} in flight (sampled ahead at "
                "rl.max_staleness >= 1); their steps learn from them, later steps sample their own")
        save_config(workdir, s.record)
        guard = DivergenceGuard(s.guard, s.learner.updates(s.rollout.rows), s.steps, self.policy,
                                abstain_abort=s.alarms.abstain_abort, abstain_steps=s.alarms.flat_alarm_steps,
                                server=s.reward_service or s.inference.url,  # (a service reports its judge's)
                                max_failed_fraction=s.inference.max_failed_fraction)
        logger = MetricsLogger(workdir, resume_step=start, tensorboard=s.metrics.tensorboard, wandb=s.metrics.wandb,
                               wandb_project=s.metrics.wandb_project, record=s.record, name=workdir.name)
        stop = StopSignals()
        compiles = CompileLap()  # this process's compiles, each step's logged with it (`rrc_jax.compiles`)
        try:
            if start == 0:
                metrics = {**self.evaluate(0), **self.memory(), **self.system(), **self.data_counts(),
                           **compiles.lap()}
                logger.log(0, metrics)
                guard.check_requests(0, metrics)
            if self.pipeline is not None:
                self.refill(start)
            with Progress(s.steps, "train", start=start) as bar:
                for step in range(start + 1, s.steps + 1):
                    metrics = self.step(step)
                    if s.eval.due(step, s.steps):
                        if self.pipeline is not None:  # the evaluation asks the judge: nothing else may
                            self.pipeline.drain()
                        metrics.update(self.evaluate(step))
                    metrics.update(compiles.lap())
                    ckpt.check()  # a save that failed (a full disk) stops the run before this step is logged
                    logger.log(step, metrics)
                    bar.update(1, reward=metrics["reward/mean"], **({"oracle": metrics["oracle_quality"]}
                                                                     if "oracle_quality" in metrics else {}))
                    guard.check(step, metrics, self.policy)  # a failed step is never saved, nor exported
                    ckpt.end_step(step, self.learner, data, stop, last=step == s.steps)
            ckpt.wait()
            save_hf(self.policy, workdir / "hf_export", tokenizer=self.tokenizer)  # under LoRA, merged
            say(f"exported the policy to {workdir / 'hf_export'}")
            if s.lora.enabled:
                save_adapter(self.policy, workdir / "adapter", base=self.roles.path("policy"))
                say(f"exported its adapters to {workdir / 'adapter'} (PEFT)")
        except CheckpointWriteError as e:  # keep no line of a step past the last checkpoint on disk
            logger.close()
            MetricsLogger(workdir, resume_step=e.last_saved or 0, tensorboard=False).close()  # as a resume would
            raise
        finally:
            stop.restore()
            if self.pipeline is not None:
                self.pipeline.close()
            logger.close()
            ckpt.close()
        return workdir

    def refill(self, start: int) -> None:
        """Before the step after `start`: the batches a checkpoint held in flight handed to the judge again, and
        those missing (a new run's first k) sampled now (`rrc_jax.rl.pipeline`)."""
        p = self.pipeline
        for step, sampled in sorted(p.restored.items()):
            p.put(step, sampled, self.dumps(step))
        p.restored = {}
        for step in in_flight_steps(start, p.k, self.settings.steps):
            if step not in p.sampled:
                self.launch(step, version=start)


def training_prompts(settings: TrainerSettings, roles: Roles) -> tuple[PromptSet, PromptSet]:
    """The (training, held-out) prompts of a run (`settings.prompts`; judge questions of the reward construction's
    `questions` kind with `data.format`), without those longer than what the policy's and, for a reward that asks
    the GRM, the judge's contexts fit with their generation budgets (`prompt_token_limit`)."""
    source = settings.prompts
    if source.data.path == "toy" and not source.data.format:
        check_toy_eval_prompts(source)  # before the models (the toy world) load
    judged = "grm" in settings.reward_roles
    limit = prompt_token_limit(source.data.max_prompt_tokens, settings.rollout.max_new_tokens,
                               roles.config("policy").max_position_embeddings,
                               settings.judge if judged else None,
                               roles.config("grm").max_position_embeddings if judged else None,
                               roles.tokenizer("grm") if judged else None)
    return load_prompts(source, roles.tokenizer("policy"), max_tokens=limit,
                        questions=settings.reward.questions or "pairwise")


def run(settings: TrainerSettings) -> epath.Path:
    """Train per `settings` (`rrc_jax.config.validate`), holding its workdir against a second trainer and resuming
    only under the same config (`rrc_jax.workdir`); returns the workdir."""
    workdir = epath.Path(settings.workdir).expanduser()
    with WorkdirLock(workdir):
        check_resume(settings.record, workdir, settings.resume)
        return Trainer(settings).run()
