"""This project, tunix and TRL side by side: the same checkpoint, prompts, group size and lengths, in one run.

    python benchmarks/peers.py [--prompts=8 --group=8 --prompt_len=64 --new_tokens=128 --repeats=3 --seed=0
                               --frameworks=rrc_jax,tunix,trl --model=DIR|real --out=FILE]

A Llama-architecture checkpoint every framework loads (transformers' `LlamaForCausalLM`, random weights, RoPE theta
1e6 and tied embeddings, which tunix's Llama assumes; a character tokenizer) is written once, or `--model` names a
Hugging Face Llama directory (`real`: SmolLM2-135M-Instruct, `rrc_jax.models.real_model`; its RoPE theta is 1e5, so
tunix's numerics differ from the checkpoint's, not its cost); then each framework runs in a process of its own,
float32 on the CPU:

- rollout: `--prompts` prompts of `--prompt_len` token ids x `--group` samples x exactly `--new_tokens` new tokens
  (temperature 1, no stop token), the way each framework's GRPO samples: ours `JaxSampler.generate` (a group
  prefilled once), tunix its `RLCluster` rollout (the "vanilla" engine), TRL transformers' `generate` as its
  `GRPOTrainer` calls it without vLLM. Generated tokens/s, the best of `--repeats` calls after a warm-up call.
- update: one GRPO policy update (loss, gradient, AdamW step; beta 0, so no reference model) on the group's
  `prompts x group` sequences of `prompt_len + new_tokens` tokens with given advantages: ours `Learner.update` on
  `grpo_objective`, tunix its actor trainer's step (`rl_cluster.update_actor`), TRL `GRPOTrainer.compute_loss`,
  backward and its optimizer's step. The best of `--repeats` after a warm-up.
- peak memory: the process's peak resident set (`ru_maxrss`): the framework, its model, its compiled programs.

Prints the table with ratios against this project (a peer's tokens/s over ours, its seconds over ours, its memory
over ours) and writes benchmarks/results/peers.json. tunix runs in the environment `.ci/tunix_env` makes (it pins
releases this project does not; `$RRC_TUNIX_PYTHON` names another); without it its row says so. Timings on a
shared machine move by tens of percent between runs: compare ratios from one run only.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from absl import flags

from rrc_jax import cli

REPO = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("rrc_jax", "tunix", "trl")
MODEL = dict(vocab_size=128, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, rope_theta=1e6, tie_word_embeddings=True, max_position_embeddings=512,
             bos_token_id=1, eos_token_id=2, pad_token_id=0)


def log(*items) -> None:
    print(*items, file=sys.stderr, flush=True)


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed(fn, repeats: int) -> tuple[float, float, object]:
    """(warm-up seconds, best seconds of `repeats`, the last result) of `fn()`."""
    t = time.perf_counter()
    out = fn()
    warmup = time.perf_counter() - t
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return warmup, best, out


def build_checkpoint(path: Path) -> int:
    """The shared checkpoint: a random `LlamaForCausalLM` (`MODEL`) and a character tokenizer; returns the
    tokenizer's size (the workload's ids are below it, so every framework can decode them)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rrc_jax.models.char_tokenizer import make_char_tokenizer

    torch.manual_seed(0)
    tokenizer = make_char_tokenizer()
    if len(tokenizer) > MODEL["vocab_size"]:
        raise RuntimeError(f"the tokenizer's {len(tokenizer)} ids do not fit the vocabulary of {MODEL['vocab_size']}")
    LlamaForCausalLM(LlamaConfig(**MODEL, initializer_range=0.2)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return len(tokenizer)


def given_checkpoint(model: str) -> tuple[Path, int]:
    """(`--model`'s directory, its tokenizer's size): `real` is the real model (built on first use); a directory
    must hold a Hugging Face Llama checkpoint, the families all three frameworks load."""
    from rrc_jax.models import load_tokenizer
    from rrc_jax.models.hf_io import read_hf_config
    from rrc_jax.models.real_model import real_model_dir

    path = real_model_dir() if model == "real" else Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise cli.flag_error("model", "not a Hugging Face model directory (no config.json); give one, or 'real'")
    if read_hf_config(path).get("model_type") != "llama":
        raise cli.flag_error("model", "not a Llama checkpoint: tunix's and this benchmark's shared model is Llama")
    return path, len(load_tokenizer(path))


def workload(args: dict) -> dict:
    """The shared inputs: prompts `[B, P]` ids, completions `[B * G, N]` ids (below `args["ids"]`) and advantages
    `[B * G]`."""
    import numpy as np

    rng = np.random.default_rng(args["seed"])
    b, g, p, n, high = args["prompts_n"], args["group"], args["prompt_len"], args["new_tokens"], args["ids"]
    return dict(prompts=rng.integers(3, high, (b, p)).tolist(), completions=rng.integers(3, high, (b * g, n)).tolist(),
                advantages=rng.standard_normal(b * g).tolist())


# -- this project ---------------------------------------------------------------------------------------------

def part_rrc_jax(args: dict) -> dict:
    import flax
    import jax
    import numpy as np
    from flax import nnx

    from rrc_jax.inference import SamplingParams, make_sampler
    from rrc_jax.models import load_hf
    from rrc_jax.rl.grpo import grpo_objective
    from rrc_jax.rl.learner import Learner, make_optimizer, token_logprobs

    b, g, p, n, repeats = args["prompts_n"], args["group"], args["prompt_len"], args["new_tokens"], args["repeats"]
    model = load_hf(args["ckpt"])
    sampler = make_sampler("policy", model, max_batch=b * g)
    params = SamplingParams(temperature=1.0, max_new_tokens=n, stop_token_ids=())
    calls = iter(range(1 << 30))
    roll_warm, roll_best, out = timed(lambda: sampler.generate(args["prompts"], g, params, rng=next(calls)), repeats)
    assert int(out.lengths.sum()) == b * g * n, out.lengths

    ids = np.concatenate([np.repeat(np.asarray(args["prompts"], np.int32), g, 0),
                          np.asarray(args["completions"], np.int32)], 1)
    mask = np.ones_like(ids, bool)
    learner = Learner(model, make_optimizer(1e-6), grpo_objective(temperature=1.0, beta=0.0, max_len=n))
    batch = dict(ids=ids, mask=mask, loss_mask=np.arange(p + n)[None].repeat(b * g, 0) >= p,
                 old_logp=np.asarray(token_logprobs(model, ids, mask)),
                 advantages=np.asarray(args["advantages"], np.float32))
    up_warm, up_best, _ = timed(lambda: jax.block_until_ready(learner.update(batch)), repeats)
    count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return dict(framework="rrc_jax", versions={"jax": jax.__version__, "flax": flax.__version__},
                params=int(count), rollout_best_s=roll_best, update_best_s=up_best, peak_rss_bytes=peak_rss(),
                warmup_s={"rollout": roll_warm, "update": up_warm},
                notes="JaxSampler.generate (each prompt prefilled once, its G rows branch the cache); Learner.update "
                      "of grpo_objective (one AdamW step, old log-probs given)")


# -- TRL ------------------------------------------------------------------------------------------------------
# Through a real `trl.GRPOTrainer` (TRL 1.16; lines of trl/trainer/grpo_trainer.py): the rollout is its
# `_generate_single_turn` (the no-vLLM path, ~L1813-1890: `model.generate` with the trainer's GenerationConfig, each
# prompt repeated G times as its RepeatSampler feeds them, L1305-1316; `min_new_tokens` through
# `generation_kwargs` so that no row stops early); the update is `compute_loss` (loss_type "dapo", TRL's default;
# beta 0; no old log-probs with one iteration, L2643-2657) + `accelerator.backward` + its optimizer's step, on
# inputs shaped as `_generate_and_score_completions` returns them (L2898-2905). Its loop's gradient clipping and
# scheduler step are not timed.

def part_trl(args: dict) -> dict:
    import numpy as np
    import torch

    # the machine's cores, unless args["threads"] says otherwise (on a shared, busy machine 2 OpenMP threads on 2
    # cores contend with the other work and can run several times slower than 1)
    torch.set_num_threads(int(args.get("threads") or os.cpu_count()))

    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    prompts = [list(map(int, p)) for p in args["prompts"]]
    b, g, n, repeats, seed = len(prompts), int(args["group"]), int(args["new_tokens"]), int(args["repeats"]), \
        int(args.get("seed", 0))
    p = len(prompts[0])
    if any(len(x) != p for x in prompts):
        raise ValueError("all prompts must have the same length")

    tokenizer = AutoTokenizer.from_pretrained(args["ckpt"], padding_side="left", truncation_side="left")
    vocab = int(transformers.AutoConfig.from_pretrained(args["ckpt"]).vocab_size)

    def reward_zero(completions, **kwargs):
        return [0.0] * len(completions)

    with tempfile.TemporaryDirectory() as out_dir:
        config = GRPOConfig(
            output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, per_device_train_batch_size=b * g,
            num_generations=g, max_completion_length=n, beta=0.0, report_to="none", save_strategy="no",
            activation_checkpointing=False, gradient_accumulation_steps=1, learning_rate=1e-6, seed=seed,
            temperature=1.0, top_p=1.0, top_k=0, logging_steps=10**9, disable_tqdm=True,
            generation_kwargs={"min_new_tokens": n},  # exactly N new tokens: EOS is suppressed until N
            model_init_kwargs={"dtype": "float32"},
        )
        dataset = Dataset.from_dict({"prompt": [tokenizer.decode(x) for x in prompts]})
        t = time.perf_counter()
        trainer = GRPOTrainer(model=args["ckpt"], reward_funcs=reward_zero, args=config, train_dataset=dataset,
                              processing_class=tokenizer)
        log(f"trl: GRPOTrainer built in {time.perf_counter() - t:.1f} s")
        model = trainer.model
        assert not config.gradient_checkpointing and not config.activation_checkpointing
        assert next(model.parameters()).dtype == torch.float32 and trainer.accelerator.device.type == "cpu"
        assert trainer.ref_model is None and trainer.beta == 0.0 and not trainer.use_vllm
        assert not trainer.use_transformers_continuous_batching
        model.train()  # the state Trainer.train leaves it in; generation runs under no_grad either way
        # Trainer's training loop sets this per optimizer step (transformers/trainer.py, `len(batch_samples)`)
        trainer.current_gradient_accumulation_steps = 1

        # -- rollout ----------------------------------------------------------------------------------------
        # RepeatSampler(mini_repeat_count=G): each prompt G times in a row, one generate call over B*G rows
        prompt_ids = [list(x) for x in prompts for _ in range(g)]
        calls = iter(range(1 << 30))

        def rollout():
            torch.manual_seed(seed + next(calls))
            completion_ids, _ = trainer._generate_single_turn(prompt_ids, None, {}, g)
            return completion_ids

        roll_warm, roll_best, completions_out = timed(rollout, repeats)
        lengths = [len(c) for c in completions_out]
        if lengths != [n] * (b * g):
            raise RuntimeError(f"expected {b * g} completions of {n} tokens, got lengths {lengths}")
        log(f"trl: rollout warm-up {roll_warm:.2f} s, best {roll_best:.3f} s")

        # -- one GRPO update --------------------------------------------------------------------------------
        device = trainer.accelerator.device
        rng = np.random.default_rng(seed)
        if args.get("completions") is not None:
            completion_ids = torch.tensor(args["completions"], dtype=torch.long)
        else:
            completion_ids = torch.from_numpy(rng.integers(3, vocab, (b * g, n))).long()
        if args.get("advantages") is not None:
            advantages = torch.tensor(args["advantages"], dtype=torch.float32)
        else:
            advantages = torch.from_numpy(rng.standard_normal(b * g).astype(np.float32))
        assert completion_ids.shape == (b * g, n) and advantages.shape == (b * g,)
        prompt_t = torch.tensor(prompt_ids, dtype=torch.long, device=device)
        completion_ids = completion_ids.to(device)
        completion_mask = torch.ones_like(completion_ids, dtype=torch.long)
        generate_every = config.steps_per_generation * trainer.num_iterations
        assert config.gradient_accumulation_steps % generate_every == 0  # => old_per_token_logps is None
        inputs = {
            "prompt_ids": prompt_t,
            "prompt_mask": torch.ones_like(prompt_t, dtype=torch.long),
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "advantages": advantages.to(device),
            "num_items_in_batch": trainer.accelerator.gather(completion_mask.sum()).sum(),
        }
        if trainer.optimizer is None:
            trainer.create_optimizer()
        optimizer = trainer.optimizer
        losses = []

        def update():
            loss = trainer.compute_loss(model, inputs)
            trainer.accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))

        up_warm, up_best, _ = timed(update, repeats)
        log(f"trl: update warm-up {up_warm:.2f} s, best {up_best:.3f} s, losses {losses}")
        count = sum(x.numel() for x in model.parameters())
        optim_name = f"{type(optimizer).__name__}({config.optim}, lr={config.learning_rate})"
        loss_type = trainer.loss_type

    return dict(
        framework="trl",
        versions={"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        params=int(count),
        rollout_best_s=roll_best,
        rollout_tokens_per_s=b * g * n / roll_best,
        update_best_s=up_best,
        update_tokens_per_s=b * g * (p + n) / up_best,
        peak_rss_bytes=peak_rss(),
        warmup_s={"rollout": roll_warm, "update": up_warm},
        notes=(f"float32 CPU, {torch.get_num_threads()} torch threads. rollout: GRPOTrainer._generate_single_turn "
               f"(transformers model.generate with the trainer's GenerationConfig: do_sample, temperature 1, top_p 1, "
               f"top_k 0, max_new_tokens={n}, plus generation_kwargs min_new_tokens={n}; dynamic KV cache) on the "
               f"{b} prompts each repeated {g}x ({b * g} rows, as RepeatSampler feeds them), incl. TRL's EOS masking "
               f"and tolist. update: trainer.compute_loss (loss_type={loss_type}, beta 0, old_per_token_logps None "
               f"-> detached current log-probs, fused LM head) + accelerator.backward + {optim_name}.step + "
               f"zero_grad on {b * g} x {p}+{n} tokens; no grad clipping, no lr_scheduler.step (Trainer's loop "
               f"adds those). Best of {repeats} after one warm-up each."),
    )


# -- tunix -----------------------------------------------------------------------------------------------------
# Through tunix's own GRPO calls (google-tunix 0.1.7, lines of tunix/rl/...): the rollout is
# `RLCluster.generate(prompts, mode=TRAIN)` as `GRPOLearner` calls it (grpo/grpo_learner.py:235-242; the "vanilla"
# engine, VanillaRollout -> generate.sampler.Sampler), each prompt repeated G times (rl_learner.py:408), EOS and pad
# forbidden so that no row stops early; the update is `RLCluster.update_actor([TrainExample])` (rl_learner.py:769:
# the jitted step of `grpo_loss_fn`, beta 0, AdamW), blocked on the parameters and the optimizer state. tunix's
# rollout takes strings: when the prompt ids do not survive its decode / re-encode, a tokenizer that maps
# placeholder strings to the exact ids stands in (`_IdPromptTokenizer`). Its Llama applies RoPE with theta 1e6
# (why the shared checkpoint has it).

class _IdPromptTokenizer:
    """Duck-typed tokenizer for tunix's TokenizerAdapter (TokenizerType.NONE).

    encode() maps the placeholder strings we pass as prompts back to the exact
    benchmark token ids; everything else is delegated to the HF tokenizer.
    bos_id() returns None when the given prompts do not start with BOS, so that
    Sampler.tokenize (sampler.py:471-478) does not prepend an extra BOS and the
    model sees exactly the P given ids.
    """

    def __init__(self, hf_tok, table, keep_bos):
        self._hf = hf_tok
        self._table = table
        self._keep_bos = keep_bos

    def encode(self, text, **kwargs):
        if text in self._table:
            return list(self._table[text])
        return self._hf.encode(text, add_special_tokens=False)

    def decode(self, ids, **kwargs):
        return self._hf.decode(ids, **kwargs)

    def bos_id(self):
        return self._hf.bos_token_id if self._keep_bos else None

    def eos_id(self):
        return self._hf.eos_token_id

    def pad_id(self):
        pid = self._hf.pad_token_id
        return self._hf.eos_token_id if pid is None else pid


def _sampler_style_ids(hf_tok, text):
    """What tunix's Sampler.tokenize (sampler.py:471-478) makes of `text`."""
    ids = list(hf_tok.encode(text))  # TokenizerAdapter.encode -> HF encode()
    bos = hf_tok.bos_token_id
    ids = ([bos] if bos else []) + ids
    i = 0
    while i < len(ids) - 1 and ids[i] == ids[i + 1] == bos:  # dedup_bos_ids
        i += 1
    return ids[i:]


def part_tunix(args: dict) -> dict:
    t_start = time.time()
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import flax
    from flax import nnx
    from transformers import AutoTokenizer
    from tunix.generate import sampler as sampler_lib
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout
    # Import baseline (tunix -> metrics_logger -> tensorboardX pulls in torch
    # when torch is installed, ~0.5 GB RSS before any model exists).
    rss_after_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    ckpt = args["ckpt"]
    prompts = [list(map(int, p)) for p in args["prompts"]]
    B = len(prompts)
    P = len(prompts[0])
    assert all(len(p) == P for p in prompts), "all prompts must have length P"
    G = int(args["group"])
    N = int(args["new_tokens"])
    repeats = max(1, int(args.get("repeats", 3)))
    seed = int(args.get("seed", 0))
    lr = float(args.get("lr", 1e-6))
    notes = []

    # ---------------- model ----------------
    from rrc_jax.integrations.tunix import TUNIX_ROPE_THETA, tunix_llama, tunix_mesh
    from rrc_jax.models.hf_io import decoder_config

    architecture = decoder_config(ckpt)
    theta = architecture.rope_theta
    if theta != TUNIX_ROPE_THETA:
        notes.append(f"WARNING: checkpoint rope_theta={theta} but tunix's Llama uses {TUNIX_ROPE_THETA:g}: numerics "
                     "differ from the checkpoint's, cost does not.")
    mesh = tunix_mesh()
    t = time.time()
    actor = tunix_llama(ckpt, mesh, dtype=jnp.float32)
    params_state = nnx.state(actor, nnx.Param)
    leaves = jax.tree.leaves(params_state)
    n_params = int(sum(int(np.prod(x.shape)) for x in leaves))
    assert all(x.dtype == jnp.float32 for x in leaves), "params not float32"
    log(f"loaded {n_params} params in {time.time()-t:.1f}s")

    # ---------------- tokenizer / prompts ----------------
    hf_tok = AutoTokenizer.from_pretrained(ckpt)
    eos_id = hf_tok.eos_token_id
    pad_id = hf_tok.pad_token_id if hf_tok.pad_token_id is not None else eos_id
    texts = [hf_tok.decode(p, skip_special_tokens=False,
                                                  clean_up_tokenization_spaces=False) for p in prompts]
    roundtrip_ok = all(_sampler_style_ids(hf_tok, s) == p
                                          for s, p in zip(texts, prompts))
    if roundtrip_ok:
        tokenizer = hf_tok
        prompt_strings = texts
        notes.append("prompts passed as decoded strings with the checkpoint's HF "
                                  "tokenizer; verified Sampler-style re-encoding (incl. BOS "
                                  "handling) reproduces the exact P ids.")
    else:
        keep_bos = all(p[0] == hf_tok.bos_token_id for p in prompts)
        table = {f"<<tunix_part_prompt_{i}>>": p for i, p in enumerate(prompts)}
        prompt_strings = list(table.keys())
        tokenizer = _IdPromptTokenizer(hf_tok, table, keep_bos)
        notes.append("prompt ids did not round-trip through decode/re-encode, so "
                                  "a duck-typed tokenizer maps placeholder prompt strings to the "
                                  "exact ids (BOS prepend " +
                                  ("kept" if keep_bos else "disabled so the model sees exactly "
                                    "the P given ids") + ").")
    # GRPO: each prompt repeated G times, consecutively (rl_learner.py:408).
    grpo_prompts = list(np.repeat(np.array(prompt_strings, dtype=object), G))
    BG = B * G

    # ---------------- RL cluster + GRPO learner ----------------
    forbidden = sorted({int(eos_id), int(pad_id)})
    rollout_cfg = base_rollout.RolloutConfig(
            max_tokens_to_generate=N,
            max_prompt_length=P,          # == prompt length: no extra left pad
            kv_cache_size=P + N,          # Sampler requires P+N <= cache size
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            seed=seed,                    # int: re-materialised per call (no donate bug)
    )
    cluster_config = rl_cluster_lib.ClusterConfig(
            role_to_mesh={
                    rl_cluster_lib.Role.ACTOR: mesh,
                    rl_cluster_lib.Role.REFERENCE: mesh,
                    rl_cluster_lib.Role.ROLLOUT: mesh,  # same mesh -> shared weights
            },
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=rl_cluster_lib.RLTrainingConfig(
                    actor_optimizer=optax.adamw(lr),
                    eval_every_n_steps=10**9,
                    max_steps=10**6,
                    checkpoint_root_directory=None,
                    metrics_logging_options=None,
                    pbar_description=None,
            ),
            rollout_config=rollout_cfg,
    )
    cluster = rl_cluster_lib.RLCluster(
            actor=actor, reference=None, tokenizer=tokenizer,
            cluster_config=cluster_config)
    learner = grpo_learner.GRPOLearner(
            rl_cluster=cluster,
            algo_config=grpo_learner.GRPOConfig(
                    num_generations=G, num_iterations=1, beta=0.0, epsilon=0.2),
            reward_fns=[lambda prompts, completions, **kw: [0.0] * len(completions)],
    )
    # GRPOLearner.__init__ installed grpo_loss_fn on the actor trainer.

    # VanillaRollout.generate (vanilla_rollout.py:54-66) has no way to pass
    # forbidden_tokens; inject them into the Sampler call so that EOS/pad are
    # never sampled (logits set to -inf, sampler.py:496-497) and every row
    # yields exactly N tokens (the decode while_loop would otherwise stop
    # early once all rows hit EOS).
    class _ForbidSampler(sampler_lib.Sampler):
        def __call__(self, *a, **kw):
            kw.setdefault("forbidden_tokens", forbidden)
            return super().__call__(*a, **kw)

    sampler = cluster.rollout._sampler  # pylint: disable=protected-access
    assert type(sampler) is sampler_lib.Sampler
    sampler.__class__ = _ForbidSampler
    assert not learner.should_sync_weights  # rollout shares actor weights

    def rollout_once():
        # Exactly GRPOLearner._generate_and_compute_advantage's call
        # (grpo_learner.py:235-242); micro_batch = rollout_micro_batch(B) * G.
        out = cluster.generate(prompts=grpo_prompts,
                                                      mode=rl_cluster_lib.Mode.TRAIN,
                                                      micro_batch_size=BG)
        # tokens are host numpy (device_get in Sampler.__call__) -> synced.
        return out

    t = time.time()
    out = rollout_once()
    warm_rollout = time.time() - t
    lens = [len(x) for x in out.tokens]
    assert len(lens) == BG and all(l == N for l in lens), lens
    lp = np.asarray(out.left_padded_prompt_tokens)
    expected_lp = np.repeat(np.array(prompts, dtype=np.int32), G, axis=0)
    assert lp.shape == (BG, P) and np.array_equal(lp, expected_lp), (
            "prompt ids seen by the sampler differ from the benchmark prompts")
    assert all(not np.isin(x, forbidden).any() for x in out.tokens)
    r_times = []
    for _ in range(repeats):
        t = time.time()
        out = rollout_once()
        r_times.append(time.time() - t)
        assert all(len(x) == N for x in out.tokens)
    rollout_best = min(r_times)
    log(f"rollout warm-up {warm_rollout:.2f}s, times {r_times}")

    # ---------------- GRPO update ----------------
    rng = np.random.default_rng(seed)
    vocab = architecture.vocab_size
    prompt_ids = jnp.asarray(expected_lp)
    completion_ids = jnp.asarray(
            rng.integers(3, vocab, size=(BG, N)).astype(np.int32))
    completion_mask = jnp.ones((BG, N), dtype=jnp.bool_)
    advantages = rng.standard_normal(BG).astype(np.float32)
    example = grpo_learner.TrainExample(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_ids != pad_id,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            ref_per_token_logps=None,      # beta == 0.0
            advantages=jax.device_put(advantages),
            old_per_token_logps=None,      # num_iterations == 1
    )
    trainer = cluster.actor_trainer

    def update_once():
        # What RLLearner._run_all_micro_batch_steps does per queue item
        # (rl_learner.py:769): rl_cluster.update_actor([TrainExample], eval, jit).
        steps0 = trainer.train_steps
        cluster.update_actor([example], None, False)
        jax.block_until_ready(nnx.state(trainer.model, nnx.Param))
        jax.block_until_ready(nnx.state(trainer.optimizer))
        assert trainer.train_steps == steps0 + 1

    before = np.asarray(jax.tree.leaves(nnx.state(trainer.model, nnx.Param))[0])
    t = time.time()
    update_once()
    warm_update = time.time() - t
    after = np.asarray(jax.tree.leaves(nnx.state(trainer.model, nnx.Param))[0])
    assert not np.array_equal(before, after), "update did not change params"
    u_times = []
    for _ in range(repeats):
        t = time.time()
        update_once()
        u_times.append(time.time() - t)
    update_best = min(u_times)
    log(f"update warm-up {warm_update:.2f}s, times {u_times}")
    try:
        loss_hist = trainer.metrics_logger.get_metric_history("actor", "loss", "train")
        log("actor loss history:", np.asarray(loss_hist).tolist())
    except Exception as e:  # pylint: disable=broad-except
        log("no loss history:", e)

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    notes.append(
            f"rollout: RLCluster.generate(prompts=B*G={BG} strings, "
            f"mode=TRAIN, micro_batch_size={BG}) -> VanillaRollout.generate -> "
            "Sampler.__call__ (host tokenize+left-pad, jitted prefill, jitted "
            "decode while_loop, device_get, detokenize); temperature=1.0, "
            f"top_p=1.0 (full-vocab categorical fast path), top_k=None, "
            f"max_prompt_length=P={P}, kv_cache_size=P+N={P+N}, forbidden_tokens="
            f"{forbidden} injected into Sampler.__call__ so every row has exactly "
            f"N={N} tokens (asserted); same seed each call. Best of {repeats} "
            "after 1 warm-up.")
    notes.append(
            "update: RLCluster.update_actor([TrainExample]) -> actor "
            "PeftTrainer.train -> nnx.jit(_train_step): value_and_grad of "
            "algo_core.grpo_loss_fn (policy loss only, beta=0.0, no reference "
            "model, num_iterations=1 so old logps = stop_gradient(current)) + "
            f"optax.adamw(lr={lr}) update + tunix per-step metric buffering; then "
            "block_until_ready on params and optimizer state. Batch "
            f"{BG}x(P+N={P+N}) tokens: prompt ids = prompts repeated G times, "
            "completion ids uniform in [3,vocab), mask all ones, advantages "
            f"N(0,1), numpy default_rng({seed}). Best of {repeats} after 1 "
            "warm-up (warm-up includes jit compile).")
    notes.append("float32 params/activations, CPU, 1 jax device, mesh "
                              "(fsdp=1,tp=1) with AxisType.Auto.")
    return dict(
            framework="tunix",
            versions={"tunix": "0.1.7", "jax": jax.__version__,
                                "flax": flax.__version__},
            params=n_params,
            rollout_best_s=rollout_best,
            rollout_tokens_per_s=BG * N / rollout_best,
            rollout_times_s=r_times,
            update_best_s=update_best,
            update_tokens_per_s=BG * (P + N) / update_best,
            update_times_s=u_times,
            peak_rss_bytes=int(peak),
            rss_after_imports_bytes=int(rss_after_imports),
            warmup_s={"rollout": warm_rollout, "update": warm_update},
            shapes={"B": B, "G": G, "P": P, "N": N, "repeats": repeats},
            total_wall_s=time.time() - t_start,
            notes=" ".join(notes),
    )


# -- the driver -------------------------------------------------------------------------------------------------

def tunix_python() -> Path | None:
    """The tunix environment's Python: `$RRC_TUNIX_PYTHON`, else `.venv-tunix/bin/python` (`.ci/tunix_env`)."""
    path = Path(os.environ.get("RRC_TUNIX_PYTHON", REPO / ".venv-tunix" / "bin" / "python"))
    return path if path.is_file() else None


def run_part(framework: str, args: dict, scratch: Path) -> dict:
    """One framework's figures, measured in a process of its own (its Python: the tunix environment's for tunix)."""
    python = tunix_python() if framework == "tunix" else Path(sys.executable)
    if python is None:
        return dict(framework=framework, skipped="no tunix environment: run `bash .ci/tunix_env` first")
    spec = scratch / f"{framework}.json"
    spec.write_text(json.dumps(args))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TF_CPP_MIN_LOG_LEVEL": "3", "TOKENIZERS_PARALLELISM": "false"}
    t = time.perf_counter()
    out = subprocess.run([str(python), __file__, f"--part={framework}", f"--spec={spec}"], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=900)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        return dict(framework=framework, failed=out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"])
    result = json.loads(lines[-1][len("RESULT "):])
    b, g, p, n = args["prompts_n"], args["group"], args["prompt_len"], args["new_tokens"]
    result.update(rollout_tokens_per_s=b * g * n / result["rollout_best_s"],
                  update_tokens_per_s=b * g * (p + n) / result["update_best_s"], wall_s=time.perf_counter() - t)
    log(f"{framework}: rollout {result['rollout_tokens_per_s']:.0f} tokens/s, update {result['update_best_s']:.3f} s, "
        f"peak RSS {result['peak_rss_bytes'] / 2**20:.0f} MiB ({result['wall_s']:.0f} s)")
    return result


def table(results: list[dict]) -> str:
    """The figures as a Markdown table, each peer's ratio to this project beside them."""
    ours = next(r for r in results if r["framework"] == "rrc_jax")
    rows = ["| framework | rollout tokens/s | vs rrc_jax | GRPO update s | vs rrc_jax | peak RSS MiB | vs rrc_jax |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if "rollout_best_s" not in r:
            rows.append(f"| {r['framework']} | {r.get('skipped') or r.get('failed')} | | | | | |")
            continue
        rows.append(f"| {r['framework']} | {r['rollout_tokens_per_s']:.0f} | "
                    f"{r['rollout_tokens_per_s'] / ours['rollout_tokens_per_s']:.2f}x | {r['update_best_s']:.3f} | "
                    f"{r['update_best_s'] / ours['update_best_s']:.2f}x | {r['peak_rss_bytes'] / 2**20:.0f} | "
                    f"{r['peak_rss_bytes'] / ours['peak_rss_bytes']:.2f}x |")
    return "\n".join(rows)


def define_flags() -> None:
    """The benchmark's flags (module docstring); `--part` and `--spec` are how the driver runs one framework's part
    in a process of its own (`run_part`)."""
    flags.DEFINE_integer("prompts", 8, "Prompts per rollout.")
    flags.DEFINE_integer("group", 8, "Samples per prompt (the GRPO group).")
    flags.DEFINE_integer("prompt_len", 64, "Token ids per prompt.")
    flags.DEFINE_integer("new_tokens", 128, "New tokens per sample (exactly: no stop token).")
    flags.DEFINE_integer("repeats", 3, "Timed calls of each measurement after a warm-up (the best counts).")
    flags.DEFINE_integer("seed", 0, "PRNG seed of the workload.")
    flags.DEFINE_string("frameworks", ",".join(FRAMEWORKS), f"Comma-separated, of {', '.join(FRAMEWORKS)}.")
    flags.DEFINE_string("model", "", "A Hugging Face Llama directory, or `real` (the real model); empty: a random "
                        "checkpoint of the module's shape.")
    flags.DEFINE_string("out", str(REPO / "benchmarks" / "results" / "peers.json"), "JSON path.")
    flags.DEFINE_enum("part", None, FRAMEWORKS, "Internal: measure this one framework in this process (with --spec).")
    flags.DEFINE_string("spec", None, "Internal: the JSON file of --part's workload.")


def run() -> None:
    """Measure every framework of `--frameworks`, each in a process of its own; print the table, write the JSON
    (module docstring). With `--part`, measure that framework in this process and print its `RESULT {json}`."""
    a = flags.FLAGS
    if a.part:
        args = json.loads(Path(a.spec).read_text())
        print("RESULT " + json.dumps(PARTS[a.part](args)), flush=True)
        return
    cli.check_at_least(1, "prompts")
    cli.check_at_least(2, "group")
    cli.check_at_least(1, "prompt_len", "new_tokens", "repeats")
    unknown = set(a.frameworks.split(",")) - set(FRAMEWORKS)
    if unknown:
        raise cli.flag_error("frameworks", f"unknown {', '.join(sorted(unknown))}; known: {', '.join(FRAMEWORKS)}")
    frameworks = ["rrc_jax"] + [f for f in a.frameworks.split(",") if f != "rrc_jax"]
    given = given_checkpoint(a.model) if a.model else None
    settings = dict(prompts_n=a.prompts, group=a.group, prompt_len=a.prompt_len, new_tokens=a.new_tokens,
                    repeats=a.repeats, seed=a.seed, frameworks=a.frameworks, model=a.model or "random")
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        ckpt, ids = given or (scratch / "ckpt", build_checkpoint(scratch / "ckpt"))
        args = dict(settings, out=a.out, part=None, spec=None, ckpt=str(ckpt), ids=ids)
        args.update(workload(args))
        results = [run_part(f, args, scratch) for f in frameworks]
    print(table(results))
    print(f"\n{ckpt.name if given else 'random'} checkpoint, {a.prompts} prompts x {a.group} samples, prompt "
          f"{a.prompt_len} + {a.new_tokens} new tokens, float32 on the CPU, best of {a.repeats}; "
          f"{time.perf_counter() - t:.0f} s in all")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from rrc_jax.models.hf_io import read_hf_config  # (here: each framework's process imports this module)

    model = read_hf_config(ckpt) if given else MODEL
    out.write_text(json.dumps(dict(settings=settings, model=model, results=results), indent=1) + "\n")


PARTS = {"rrc_jax": part_rrc_jax, "tunix": part_tunix, "trl": part_trl}

if __name__ == "__main__":
    define_flags()
    cli.start(cli.flags_main(run))
