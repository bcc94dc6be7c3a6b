"""LoRA and QLoRA on the policy (`rrc_jax.models.lora`, `rrc_jax.models.peft_io`): the adapted model starts as
the base, only the adapters train, PEFT loads our adapters with equal logits, the merged export equals the adapted
model, the reference costs no second base, a resume is exact and refuses another base, and an int8 / nf4 base
trains on 8 devices."""

import json
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from conftest import (cli_args, cpu_devices_env, killed_and_resumed, make_hf_model, padded_batch, read_metrics,
                      tiny_config)
from rrc_jax.config import validate
from rrc_jax.errors import ConfigError
from rrc_jax.models import load_hf, save_hf
from rrc_jax.models.lora import LoraConfig, adapter_count, frozen_copy, trainable
from rrc_jax.models.peft_io import load_adapter, save_adapter
from rrc_jax.rl.learner import Learner, make_optimizer, token_logprobs

REPO = Path(__file__).resolve().parents[1]
LORA = LoraConfig(rank=4, alpha=8.0)


@pytest.fixture(scope="module", params=["llama3_untied", "qwen2_tied"])
def base(request, tmp_path_factory):
    """(directory, transformers model class) of a tiny transformers-made Llama / Qwen2 checkpoint."""
    path = tmp_path_factory.mktemp(request.param)
    model = make_hf_model(request.param)
    model.save_pretrained(path)
    return path, type(model)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The directory of a tiny transformers-made Llama checkpoint."""
    path = tmp_path_factory.mktemp("llama")
    make_hf_model("llama3_untied").save_pretrained(path)
    return path


def randomized(model, scale=0.1):
    """`model` with random non-zero adapters (B too), so that they change the logits."""
    state = nnx.state(model, nnx.LoRAParam)
    for i, (_, var) in enumerate(nnx.to_flat_state(state)):
        var.set_value(scale * jax.random.normal(jax.random.key(i), var.shape, jnp.float32))
    nnx.update(model, state)
    return model


def test_zero_adapters_give_the_base_exactly_and_a_zero_kl(base):
    """Adapters initialised as PEFT does (B = 0): log-probs equal the base model's bit for bit, and so do the
    reference's (the frozen copy of the policy's initial adapters): the KL to the reference is 0."""
    path, _ = base
    ids, mask = padded_batch([9, 6, 9], pad_side="left")
    plain = token_logprobs(load_hf(path), ids, mask)
    policy = load_hf(path, lora=LORA)
    assert adapter_count(policy) > 0 and trainable(policy) is nnx.LoRAParam
    np.testing.assert_array_equal(np.asarray(token_logprobs(policy, ids, mask)), np.asarray(plain))
    reference = frozen_copy(policy)
    np.testing.assert_array_equal(np.asarray(token_logprobs(reference, ids, mask)), np.asarray(plain))


def test_peft_loads_our_adapters_and_the_merged_export_equals_them(base, tmp_path):
    """`save_adapter` -> `peft.PeftModel.from_pretrained` on the transformers base: logits within 1e-4 of ours on a
    right-padded batch; `save_hf` (merged) -> transformers: within 1e-4 of the adapted model; `load_adapter` reads
    the directory back exactly; an adapter of another rank is a one-line error."""
    peft = pytest.importorskip("peft")
    path, cls = base
    model = randomized(load_hf(path, lora=LORA))
    ids, mask = padded_batch([9, 5], pad_side="right")
    ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    real = mask.astype(bool)
    save_adapter(model, tmp_path / "adapter", base=path)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and len(config["target_modules"]) == 7
    adapted = peft.PeftModel.from_pretrained(cls.from_pretrained(path), tmp_path / "adapter").eval()
    with torch.no_grad():
        theirs = adapted(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4)
    save_hf(model, tmp_path / "merged")
    assert "lora" not in json.loads((tmp_path / "merged" / "config.json").read_text())
    with torch.no_grad():
        merged = cls.from_pretrained(tmp_path / "merged")(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
    np.testing.assert_allclose(ours[real], merged.numpy()[real], atol=1e-4)
    again = load_hf(path, lora=LORA)
    load_adapter(again, tmp_path / "adapter")
    np.testing.assert_array_equal(np.asarray(again(jnp.asarray(ids), jnp.asarray(mask))), ours)
    with pytest.raises(ConfigError, match=r"the adapter's rank is 4, config.policy.lora's 8; set"):
        load_adapter(load_hf(path, lora=LoraConfig(rank=8)), tmp_path / "adapter")


def test_the_learner_moves_only_the_adapters(base):
    """One update changes adapters only (the base bit for bit as loaded), and the optimizer state holds two moments
    of the adapters, nothing of the base."""
    path, _ = base
    model = load_hf(path, lora=LORA)
    frozen_before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.LoRAParam))))
    adapters_before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam)))
    ids, mask = padded_batch([9, 7, 9, 8])

    def loss_fn(m, batch):
        return -m.token_logprobs(batch["ids"], batch["mask"]).mean(), {}

    learner = Learner(model, make_optimizer(1e-2), loss_fn)
    learner.update({"ids": jnp.asarray(ids), "mask": jnp.asarray(mask)})
    frozen_after = nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.LoRAParam)))
    jax.tree.map(np.testing.assert_array_equal, frozen_before, jax.tree.map(np.asarray, frozen_after))
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), adapters_before,
                                           nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam))))
    assert any(changed)
    moments = sum(x.size for x in jax.tree.leaves(learner.opt_state) if x.ndim)
    assert moments == 2 * adapter_count(model)


def test_lora_dropout_drops_each_adapters_input_as_peft_does():
    """`lora.delta` with row keys: with A = B = I (alpha = r, scale 1) the delta is the dropped input itself: each
    element 0 or x / (1 - p), about a fraction p of them 0, each row's mask from its own key (a row's output does
    not depend on the others), each projection its own mask, the mean over many keys x (inverted dropout); without
    keys, no dropout."""
    from types import SimpleNamespace

    from rrc_jax.models.lora import delta

    p, e, rows = 0.25, 16, 4
    eye = jnp.eye(e)
    module = SimpleNamespace(lora=LoraConfig(rank=e, alpha=float(e), dropout=p), q_lora_a=eye, q_lora_b=eye,
                             k_lora_a=eye, k_lora_b=eye)
    x = jax.random.normal(jax.random.key(0), (rows, 3, e)) + 2.0  # [B, T, E], no zeros
    keys = jax.random.split(jax.random.key(1), rows)
    out = np.asarray(delta(module, "q", x, keys))
    kept = out != 0
    np.testing.assert_allclose(out[kept], np.asarray(x)[kept] / (1 - p), rtol=1e-6)
    assert 0.1 < 1 - kept.mean() < 0.4
    np.testing.assert_array_equal(np.asarray(delta(module, "q", x[1:3], keys[1:3])), out[1:3])
    assert not np.array_equal(np.asarray(delta(module, "k", x, keys)) != 0, kept)
    np.testing.assert_allclose(np.asarray(delta(module, "q", x)), np.asarray(x), rtol=1e-6)
    many = jax.vmap(lambda k: delta(module, "q", x, jax.random.split(k, rows)))(
        jax.random.split(jax.random.key(2), 4000))
    np.testing.assert_allclose(np.asarray(many.mean(0)), np.asarray(x), rtol=0.1)


def test_lora_dropout_in_the_learner_is_per_row(llama):
    """The GRPO loss with `dropout_seed`: fresh adapters (B = 0) give the base's log-probs exactly whatever the
    masks; random adapters under dropout change the loss, and an update in micro-batches of 2 rows equals the
    whole minibatch's (the masks are the rows' own)."""
    from rrc_jax.rl.grpo import grpo_objective

    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.3)
    ids, mask = padded_batch([9, 7, 9, 8])
    seeds = jnp.arange(4, dtype=jnp.uint32) + 7
    fresh = load_hf(llama, lora=lora)
    np.testing.assert_array_equal(np.asarray(fresh.token_logprobs(jnp.asarray(ids), jnp.asarray(mask),
                                                                  dropout_seed=seeds)),
                                  np.asarray(load_hf(llama).token_logprobs(jnp.asarray(ids), jnp.asarray(mask))))
    model = randomized(load_hf(llama, lora=lora))
    batch = {"ids": jnp.asarray(ids), "mask": jnp.asarray(mask), "loss_mask": jnp.asarray(mask),
             "advantages": jnp.asarray([1.0, -1.0, 0.5, -0.5]), "dropout_seed": seeds,
             "old_logp": model.token_logprobs(jnp.asarray(ids), jnp.asarray(mask))}  # the sampler's: no dropout
    loss_fn = grpo_objective()
    with_dropout, _ = loss_fn(model, batch)
    without, _ = loss_fn(model, {k: v for k, v in batch.items() if k != "dropout_seed"})
    assert abs(float(with_dropout) - float(without)) > 1e-4
    after, start = [], jax.tree.map(np.array, nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam)))  # a copy
    for micro in (0, 2):
        adapters = nnx.state(model, nnx.LoRAParam)
        nnx.replace_by_pure_dict(adapters, jax.tree.map(jnp.asarray, start))  # the same random adapters each time
        nnx.update(model, adapters)
        Learner(model, make_optimizer(1e-2), loss_fn, micro_batch_size=micro).update(batch)
        after.append(jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam))))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), *after)


def test_a_checkpoint_refuses_another_base(tmp_path, llama):
    """The manifest records the frozen base's hash; resuming the adapters on another base is one line."""
    from rrc_jax.checkpoint import Checkpointer, base_hash
    from rrc_jax.checkpoint import Replay

    path = llama
    model = load_hf(path, lora=LORA)
    other = load_hf(path, lora=LORA)
    weights = nnx.state(other, nnx.Param)  # another base: one base weight changed
    first = [v for p, v in nnx.to_flat_state(weights) if p[-1] == "embed"][0]
    first.set_value(first[...] + 1.0)
    nnx.update(other, weights)
    assert base_hash(model) == base_hash(load_hf(path, lora=LORA)) != base_hash(other)
    learner = Learner(model, make_optimizer(1e-3), lambda m, b: (jnp.zeros(()), {}))
    saver = Checkpointer(tmp_path / "ckpt", model_hash=base_hash(model))
    saver.maybe_save(1, learner, Replay(iter(range(5))), force=True)
    saver.close()
    resumed = Learner(other, make_optimizer(1e-3), lambda m, b: (jnp.zeros(()), {}))
    with pytest.raises(ConfigError, match=r"holds adapters trained on another base model \(model hash [0-9a-f]+, "
                                          r"this run's base [0-9a-f]+\): point config.models.policy") as e:
        Checkpointer(tmp_path / "ckpt", model_hash=base_hash(other)).resume(resumed, Replay(iter(range(5))))
    assert "\n" not in str(e.value)
    assert Checkpointer(tmp_path / "ckpt", model_hash=base_hash(model)).resume(
        Learner(load_hf(path, lora=LORA), make_optimizer(1e-3), lambda m, b: (jnp.zeros(()), {})),
        Replay(iter(range(5)))) == 1


@pytest.mark.parametrize("qtype", ["int8", "nf4"])
def test_a_quantized_base_is_stored_quantized_and_trains_its_adapters(llama, qtype):
    """QLoRA on one device: the projections are stored as qwix quantizes them (int8 values, or nf4's 4-bit codes and
    one scale per 16 input weights), the logits stay near the base's, and an update moves the adapters only."""
    path = llama
    model = load_hf(path, lora=LoraConfig(rank=4, alpha=8.0, weight_qtype=qtype, block_size=16))
    attn = model.layers.attn
    assert attn.qkv[...].dtype == (jnp.int8 if qtype == "int8" else jnp.uint4)
    assert attn.qkv_scale.shape[1] == (1 if qtype == "int8" else model.cfg.hidden_size // 16)
    ids, mask = padded_batch([9, 7])
    plain = np.asarray(load_hf(path)(jnp.asarray(ids), jnp.asarray(mask)))
    quantized = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    assert np.abs(quantized - plain).max() < (0.05 if qtype == "int8" else 0.5)
    codes = np.asarray(attn.qkv[...]).copy()
    learner = Learner(model, make_optimizer(1e-2), lambda m, b: (-m.token_logprobs(b["ids"], b["mask"]).mean(), {}))
    learner.update({"ids": jnp.asarray(ids), "mask": jnp.asarray(mask)})
    np.testing.assert_array_equal(np.asarray(model.layers.attn.qkv[...]), codes)
    assert not np.array_equal(np.asarray(model(jnp.asarray(ids), jnp.asarray(mask))), quantized)


@pytest.mark.parametrize("qtype", ["nf4", pytest.param("int8", marks=pytest.mark.slow)])
def test_a_quantized_base_trains_on_8_devices(tmp_path, toy_cache, qtype):
    """QLoRA: the policy's projections stored in int8 / nf4 (qwix), two steps on 8 CPU devices (FSDP 8, the rollout
    copy in the inference layout). The int8 run is under the slow marker: it differs from nf4's only in the
    quantizer, which the one-device test above covers for both."""
    overrides = {"policy.lora.rank": 2, "policy.lora.alpha": 4.0, "policy.lora.weight_qtype": qtype,
                 "policy.lora.block_size": 32, "mesh.fsdp": 8, "rl.minibatch_size": 16, "eval.every": 0}
    cmd = cli_args(tmp_path / "w", toy_cache, kind="drm", **overrides)  # the cheapest reward: no judge
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, env=cpu_devices_env(8))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(tmp_path / "w")
    assert rows[0]["system/devices"] == 8 and rows[2]["skipped_updates"] == 0
    assert np.isfinite(rows[2]["loss"])


def test_a_sigkilled_lora_run_resumes_to_the_same_metrics(tmp_path, toy_cache):
    """A LoRA run with the KL and LoRA dropout on: its first update's KL is 0 (the policy starts as its reference:
    B = 0, whatever the dropout masks), no reference model is loaded, the optimizer holds the adapters only (under
    10% of a full fine-tune's AdamW), the run exports the merged model and the PEFT adapter, and `init_from` that
    adapter starts a run there. SIGKILLed after its step-2 checkpoint (the adapters, their optimizer state and the
    data state), it resumes to metrics identical to the uninterrupted run's (the dropout masks too).

    The run also takes the learner options of `test_learner_options` (one SIGKILL run for both): SCR on the tests' toy
    world, its judge sampled and cut at 20 tokens (it abstains often: some groups tie), with dynamic sampling, RLOO advantages, GSPO's loss and
    DAPO's overlong penalty. Some step draws again and leaves constant groups out; a step trains on constant groups
    only as far as its draws ran out; the resume replays the same extra draws (from the checkpointed data state)."""
    from test_faults import assert_same_metrics
    from rrc_jax.rl.trainer import Trainer, run

    overrides = {"steps": 4, "checkpoint.save_every": 2, "eval.every": 2, "policy.lora.rank": 2,
                 "policy.lora.alpha": 4.0, "policy.lora.dropout": 0.1, "rl.beta": 0.05,
                 "rl.minibatch_size": 16,  # one update a step
                 "rl.dynamic_sampling": True, "rl.max_draws": 3, "rl.advantage": "rloo", "rl.loss": "gspo",
                 "rl.overlong": 2, "reward.judge.temperature": 1.0,
                 "seed": 6}  # a seed whose step 4 draws again (a constant group)
    workdir = run(validate(tiny_config("scr", tmp_path / "straight", toy_cache, **overrides)))
    straight = read_metrics(workdir)
    assert straight[1]["kl"] == 0.0 and straight[2]["kl"] > 0
    assert "memory/reference_params_bytes_per_device" not in straight[0]
    full = nnx.state(load_hf(next(Path(toy_cache).glob("toy-*/policy"))), nnx.Param)  # AdamW: 2 float32 moments
    assert straight[0]["memory/optimizer_bytes_per_device"] < 0.1 * 2 * sum(x.nbytes for x in jax.tree.leaves(full))
    assert (workdir / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((workdir / "hf_export" / "config.json").read_text())["model_type"] == "llama"
    steps = [straight[s] for s in range(1, 5)]
    assert all(1 <= r["data/draws_per_step"] <= 3 for r in steps)
    assert any(r["data/draws_per_step"] > 1 and r["data/filtered_groups"] > 0 for r in steps)
    for r in steps:  # what the learner saw: constant groups only where the draws ran out
        assert r["reward/flat_groups"] * 4 == r["data/unfilled_groups"]
        assert r["data/unfilled_groups"] == 0 or r["data/draws_per_step"] == 3
        assert -1.0 <= r["reward/overlong_penalty"] <= 0.0
    again = Trainer(validate(tiny_config("scr", tmp_path / "again", toy_cache, init_from=str(workdir / "adapter"),
                                **overrides)))
    exported = load_hf(workdir / "hf_export")
    ids, mask = padded_batch([9, 6], vocab=exported.cfg.vocab_size)
    np.testing.assert_allclose(np.asarray(again.policy(jnp.asarray(ids), jnp.asarray(mask))),
                               np.asarray(exported(jnp.asarray(ids), jnp.asarray(mask))), atol=1e-5)

    killed = tmp_path / "killed"
    resumed = killed_and_resumed(killed, cli_args(killed, toy_cache, kind="scr", **overrides), killed_at=2, final=4)
    assert_same_metrics(straight, resumed)
