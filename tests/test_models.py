"""Decoder parity with transformers' PyTorch Llama / Qwen2, HF round trip, logical axes, chunked log-probs."""

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from conftest import cpu_devices_env, make_hf_model, padded_batch
from rrc_jax.models import Decoder, DecoderConfig, load_hf, save_hf
from rrc_jax.sharding import model_context


def torch_logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask, dtype=torch.long)).logits.float().numpy()


@pytest.mark.parametrize("side", ["left", "right"])
def test_logits_match_transformers_on_padded_batch(hf_checkpoint, side):
    kind, path, ref_model = hf_checkpoint
    model = load_hf(path)
    ids, mask = padded_batch([5, 23, 11, 17], side)
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    ref = torch_logits(ref_model, ids, mask)
    real = mask.astype(bool)
    assert ours.shape == ref.shape == (4, 23, ref_model.config.vocab_size)
    np.testing.assert_allclose(ours[real], ref[real], atol=1e-4, rtol=0)


def test_blockwise_attention_matches_transformers_and_dense_gradients(hf_checkpoint, monkeypatch):
    """With 8-key blocks (a 23-token batch spans three), the training attention (`blockwise_attention`) still gives
    transformers' logits, and its gradients equal dense attention's wherever a query sees a key."""
    from rrc_jax.models import attention

    kind, path, ref_model = hf_checkpoint
    monkeypatch.setattr(attention, "TRAINING_ATTENTION_BLOCK", 8)
    ids, mask = padded_batch([5, 23, 11, 17], "left")
    ours = np.asarray(load_hf(path)(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], torch_logits(ref_model, ids, mask)[real], atol=1e-4, rtol=0)
    rng = np.random.default_rng(0)
    b, kh, g, t, d = 2, 2, 2, 40, 8
    q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32)
               for shape in ((b, kh, g, t, d), (b, kh, d, t), (b, kh, t, d)))
    causal = jnp.tril(jnp.ones((t, t), bool))[None] & (jnp.arange(t) >= jnp.array([[3], [0]]))[:, None, :]
    sees = causal.any(-1)[:, None, None, :, None]
    grads = lambda fn: jax.grad(lambda *x: (jnp.where(sees, fn(*x, causal), 0) ** 2).sum(), argnums=(0, 1, 2))(q, k, v)
    for a, b_ in zip(grads(attention.dense_attention), grads(lambda *x: attention.blockwise_attention(*x, block=16))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b_), atol=1e-5)


def test_config_reads_family_details(hf_checkpoint):
    kind, path, ref = hf_checkpoint
    cfg = load_hf(path).cfg
    assert cfg.tie_word_embeddings == kind.endswith("_tied")
    assert cfg.qkv_bias == (kind.startswith("qwen2") or bool(getattr(ref.config, "attention_bias", False)))
    assert cfg.qk_norm == hasattr(ref.model.layers[0].self_attn, "q_norm")  # per-head RMSNorm (Qwen3, Gemma 3)
    assert cfg.head_dim == ref.model.layers[0].self_attn.head_dim
    assert cfg.head_dim == (cfg.hidden_size // cfg.num_heads if kind.startswith(("llama", "qwen2", "mistral")) else 16)
    assert cfg.rope_type == ("llama3" if kind.startswith("llama3") else "linear" if kind.startswith("gemma3")
                             else "default")  # (Gemma 3: the global layers')
    # sliding layers: transformers' own per-layer choice (Mistral: every layer, when it has a window)
    layer_types = getattr(ref.config, "layer_types", None) or ["sliding_attention" if getattr(
        ref.config, "sliding_window", None) else "full_attention"] * cfg.num_layers
    assert cfg.sliding == tuple(t == "sliding_attention" for t in layer_types)
    assert cfg.sliding_window == (getattr(ref.config, "sliding_window", None) if any(cfg.sliding) else None)
    for name in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
        assert getattr(cfg, name) == getattr(ref.config, name, None)


def test_round_trip_save_hf_loads_in_transformers(hf_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    kind, path, ref_model = hf_checkpoint
    model = load_hf(path)
    save_hf(model, tmp_path / "export")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).eval()
    assert type(reloaded) is type(ref_model)
    ids, mask = padded_batch([7, 19, 12], "left", seed=3)
    np.testing.assert_allclose(torch_logits(reloaded, ids, mask), torch_logits(ref_model, ids, mask), atol=1e-5,
                               rtol=0)
    # and our own loader reads what we wrote
    again = load_hf(tmp_path / "export")
    np.testing.assert_allclose(np.asarray(again(jnp.asarray(ids), jnp.asarray(mask))),
                               np.asarray(model(jnp.asarray(ids), jnp.asarray(mask))), atol=1e-6)


def test_fused_projections_with_all_biases_round_trip_exactly(tmp_path):
    """Llama with attention and MLP biases and 3 query heads per kv head: q/k/v fuse into `qkv` and gate/up into
    `gate_up`; logits match transformers and `save_hf` gives back every tensor bit for bit."""
    ref = make_hf_model("llama3_untied", seed=5, hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
                        attention_bias=True, mlp_bias=True)
    ref.save_pretrained(tmp_path / "in")
    model = load_hf(tmp_path / "in")
    assert model.cfg.qkv_bias and model.cfg.o_bias and model.cfg.mlp_bias
    layers = model.cfg.num_layers  # every layer's parameters stacked on a leading axis
    assert model.layers.attn.qkv[...].shape == (layers, 48, 2, 5, 8)  # [L, E, K, G + 2, D]
    assert model.layers.mlp.gate_up[...].shape == (layers, 48, 64, 2)  # [L, E, I, 2]
    ids, mask = padded_batch([9, 4, 14], "left", seed=6)
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    np.testing.assert_allclose(ours[mask.astype(bool)], torch_logits(ref, ids, mask)[mask.astype(bool)], atol=1e-4)
    save_hf(model, tmp_path / "out")
    before, after = load_file(tmp_path / "in" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert set(after) == set(before) - {k for k in before if "rotary" in k}
    for name, w in after.items():
        np.testing.assert_array_equal(w, before[name], err_msg=name)


def test_sharded_save_writes_index_and_loads(tmp_path):
    ref = make_hf_model("llama3_untied")
    ref.save_pretrained(tmp_path / "src")
    model = load_hf(tmp_path / "src")
    save_hf(model, tmp_path / "sharded", max_shard_bytes=20_000)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    ids, mask = padded_batch([9, 4], "right")
    real = mask.astype(bool)
    ours = np.asarray(load_hf(tmp_path / "sharded")(jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_allclose(ours[real], torch_logits(ref, ids, mask)[real], atol=1e-4)


def test_bfloat16_params_and_compute(tmp_path):
    ref = make_hf_model("qwen2_tied")
    ref.save_pretrained(tmp_path)
    model = load_hf(tmp_path, dtype="bfloat16")
    assert model.embed[...].dtype == jnp.bfloat16
    ids, mask = padded_batch([8, 13], "left")
    out = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
    assert out.dtype == np.float32
    real = mask.astype(bool)
    assert np.abs(out[real] - torch_logits(ref, ids, mask)[real]).max() < 0.1


def test_every_parameter_has_logical_axes():
    cfg = DecoderConfig(model_type="qwen2", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=4, qkv_bias=True, value_head=True)
    from flax import nnx

    with model_context(None):
        model = Decoder(cfg, rngs=nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    assert len(leaves) > 10
    for v in leaves:
        names = v.sharding_names
        assert names is not None and len(names) == v.value.ndim


def test_meshed_construction_on_8_devices():
    """Building under a (data=2, fsdp=2, tensor=2) mesh shards parameters by their logical axes."""
    code = textwrap.dedent("""
        import jax
        from flax import nnx
        from rrc_jax.models import Decoder, DecoderConfig
        from rrc_jax.sharding import make_mesh, model_context
        cfg = DecoderConfig(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1,
                            num_heads=4, num_kv_heads=2, head_dim=4)
        mesh = make_mesh(data=2, fsdp=2, tensor=2)
        with model_context(mesh):
            model = Decoder(cfg, rngs=nnx.Rngs(0))
        spec = model.layers.mlp.gate_up[...].sharding.spec  # [L, E, I, 2]: the layers axis replicated
        assert tuple(spec) == (None, "fsdp", "tensor", None), spec
        spec = model.layers.attn.qkv[...].sharding.spec  # [L, E, K, G + 2, D]: kv heads over tensor
        assert tuple(spec) == (None, "fsdp", "tensor", None, None), spec
        assert tuple(model.embed[...].sharding.spec) == ("tensor", "fsdp")
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], env=cpu_devices_env(8), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_token_logprobs_chunked_equals_full_and_differentiates(hf_checkpoint):
    _, path, _ = hf_checkpoint
    model = load_hf(path)
    ids, mask = padded_batch([13, 6, 10], "right")
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    full = jax.nn.log_softmax(model(ids, mask), axis=-1)
    expected = jnp.take_along_axis(full[:, :-1], ids[:, 1:, None], axis=-1)[..., 0]
    for chunk in (1, 4, 64):
        lp, ent = model.token_logprobs(ids, mask, chunk_size=chunk, return_entropy=True)
        assert lp.shape == ids.shape and float(jnp.abs(lp[:, 0]).max()) == 0.0
        np.testing.assert_allclose(np.asarray(lp[:, 1:]), np.asarray(expected), atol=1e-5)
        exp_ent = -(jnp.exp(full) * full).sum(-1)[:, :-1]
        np.testing.assert_allclose(np.asarray(ent[:, 1:]), np.asarray(exp_ent), atol=1e-4)

    from flax import nnx

    def loss(m):
        return (m.token_logprobs(ids, mask, chunk_size=4) * mask).sum()

    def loss_full(m):
        f = jax.nn.log_softmax(m(ids, mask), axis=-1)
        return (jnp.take_along_axis(f[:, :-1], ids[:, 1:, None], axis=-1)[..., 0] * mask[:, 1:]).sum()

    g1 = nnx.grad(loss)(model)
    g2 = nnx.grad(loss_full)(model)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


def test_value_head_reads_last_real_token(tmp_path):
    ref = make_hf_model("llama3_untied")
    ref.save_pretrained(tmp_path)
    model = load_hf(tmp_path, value_head=True)
    model.value_head.kernel.value = jnp.linspace(-1, 1, model.cfg.hidden_size)
    ids_l, mask_l = padded_batch([5, 9], "left")
    ids_r, mask_r = padded_batch([5, 9], "right")
    v_l = model.values(jnp.asarray(ids_l), jnp.asarray(mask_l))
    v_r = model.values(jnp.asarray(ids_r), jnp.asarray(mask_r))
    assert v_l.shape == (2,)
    np.testing.assert_allclose(np.asarray(v_l), np.asarray(v_r), atol=1e-5)
    save_hf(model, tmp_path / "drm")
    np.testing.assert_allclose(np.asarray(load_hf(tmp_path / "drm").values(jnp.asarray(ids_l), jnp.asarray(mask_l))),
                               np.asarray(v_l), atol=1e-6)


# -- bad input: one-line errors naming the problem ------------------------------------------------------------

def test_error_directory_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_hf(tmp_path)


def test_error_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
    with pytest.raises(ValueError, match="unknown model_type 'gpt2'"):
        load_hf(tmp_path)


def test_error_missing_tensor(tmp_path):
    make_hf_model("qwen2_tied").save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing tensor model\.layers\.1\.mlp\.up_proj\.weight") as e:
        load_hf(tmp_path)
    assert "\n" not in str(e.value)


def test_error_tensor_of_wrong_shape(tmp_path):
    make_hf_model("llama3_untied").save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = tensors["model.layers.0.self_attn.k_proj.weight"][:-1]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"k_proj\.weight \(15, 32\).*does not convert to the shape") as e:
        load_hf(tmp_path)
    assert "\n" not in str(e.value)
