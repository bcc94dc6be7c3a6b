"""Model families as plug-ins: the registry, and end-to-end runs on a family other than Llama / Qwen2
(Qwen3). Logit, greedy, export and sequence-classifier parity with transformers run for every family's test configs
in test_models.py, test_sampling.py, test_generate_cli.py and test_hf_interop.py (their kinds come from the
registry)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import KINDS, TINY, cpu_devices_env, make_hf_model
from rrc_jax.config import settings_of
from rrc_jax.errors import ConfigError
from rrc_jax.models import load_hf
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.models.families import FAMILIES, family
from test_rm_recipes import metrics, pairs_file, rm


def test_an_unknown_model_type_is_one_line_listing_the_families(tmp_path):
    make_hf_model("qwen3_tied").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gemma5"}))
    with pytest.raises((ConfigError, ValueError)) as e:
        load_hf(tmp_path)
    assert str(e.value).count("\n") == 0 and "'gemma5'" in str(e.value)
    assert all(name in str(e.value) for name in FAMILIES)
    with pytest.raises(ValueError, match="supported: llama, qwen2, qwen3, mistral, gemma2, gemma3_text"):
        family("gemma5")


def test_every_family_has_test_configs_and_its_own_tensors_load():
    """The registry feeds the tests (no list by hand); a family's own per-layer tensors (Qwen3's q/k norms) load
    into the stacked parameters, layer by layer."""
    assert {model_type for model_type, _ in KINDS.values()} == set(FAMILIES)
    ref = make_hf_model("qwen3_untied", seed=3)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        ref.save_pretrained(d)
        model = load_hf(d)
    for n, layer in enumerate(ref.model.layers):
        np.testing.assert_array_equal(np.asarray(model.layers.attn.q_norm.scale[...][n]),
                                      layer.self_attn.q_norm.weight.detach().numpy())
        np.testing.assert_array_equal(np.asarray(model.layers.attn.k_norm.scale[...][n]),
                                      layer.self_attn.k_norm.weight.detach().numpy())
    assert model.cfg.head_dim == 16 != TINY["hidden_size"] // TINY["num_attention_heads"]


@pytest.mark.slow  # sharded training: test_mesh and test_train; the families themselves: the parity tests
def test_two_step_run_with_a_qwen3_policy_and_a_gemma3_judge_on_8_devices(tmp_path):
    """`python -m rrc_jax.train` (SCR) with a tiny Qwen3 policy and a tiny Gemma 3 GRM (a sliding layer with its
    own RoPE base, then a global one), sharded over 8 CPU devices, finishes its two steps, judges, and exports a
    Qwen3 checkpoint."""
    tokenizer = make_char_tokenizer()
    for role, kind, seed in (("policy", "qwen3_untied", 1), ("grm", "gemma3_tied", 2)):
        make_hf_model(kind, seed=seed, vocab_size=len(tokenizer),
                      max_position_embeddings=1024).save_pretrained(tmp_path / role)
        tokenizer.save_pretrained(tmp_path / role)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "rrc_jax.train", "--config=scr.py", f"--config.models.policy={tmp_path / 'policy'}",
           f"--config.models.grm={tmp_path / 'grm'}", f"--config.workdir={run}", "--config.steps=2",
           "--config.rl.prompts_per_step=4", "--config.rl.group_size=2", "--config.rl.minibatch_size=8",
           "--config.rl.max_new_tokens=8", "--config.reward.judge.max_new_tokens=16",
           "--config.eval.every=0", "--config.data.eval_prompts=8", "--config.checkpoint.save_every=0"]
    out = subprocess.run(cmd, env=cpu_devices_env(8), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows][-2:] == [1, 2] and rows[0]["system/devices"] == 8
    assert all(r["judge/questions"] > 0 for r in rows if r.get("step", 0) >= 1)
    exported = json.loads((run / "hf_export" / "config.json").read_text())
    assert exported["model_type"] == "qwen3" and exported["architectures"] == ["Qwen3ForCausalLM"]


def test_a_drm_fit_from_a_qwen3_classifier(tmp_path):
    """One `train_rm` step of a Bradley-Terry DRM initialized from a transformers `Qwen3ForSequenceClassification`
    exports a Qwen3 sequence classifier."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    tokenizer = make_char_tokenizer()
    torch.manual_seed(0)
    model_type, extra = KINDS["qwen3_untied"]
    ref = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(
        model_type, **{**TINY, **extra, "vocab_size": len(tokenizer), "num_labels": 1,
                       "max_position_embeddings": 1024}))
    ref.save_pretrained(tmp_path / "init")
    tokenizer.save_pretrained(tmp_path / "init")
    from rrc_jax.train_rm import train_reward_model

    workdir = tmp_path / "drm"
    export = train_reward_model(settings_of(rm("drm", workdir, pairs_file(tmp_path / "pairs.jsonl"), tmp_path / "init", **{"train.steps": 1})))
    assert [r["step"] for r in metrics(workdir)][-1] == 1
    exported = json.loads((export / "config.json").read_text())
    assert exported["architectures"] == ["Qwen3ForSequenceClassification"]
    assert load_hf(export).cfg.value_head and load_hf(export).cfg.qk_norm


@pytest.mark.parametrize("kind,arch", [("mistral_window", "MistralForSequenceClassification"),
                                       ("gemma2_tied", "Gemma2ForSequenceClassification"),
                                       ("gemma3_tied", "Gemma3TextForSequenceClassification")])
def test_a_sequence_classifier_exports_back_to_transformers(tmp_path, kind, arch):
    """A transformers sequence classifier of Mistral / Gemma 2 / Gemma 3 loads as the DRM, and `save_hf` writes it
    back as the same class, which transformers loads whole and which scores as ours (within 1e-4)."""
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForSequenceClassification

    from rrc_jax.models import save_hf
    from test_hf_interop import VOCAB, make_hf_classifier, torch_scores
    from conftest import padded_batch

    make_hf_classifier(kind, seed=4).save_pretrained(tmp_path / "in")
    drm = load_hf(tmp_path / "in")
    save_hf(drm, tmp_path / "out", tokenizer=make_char_tokenizer())
    ref, info = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out", dtype=torch.float32,
                                                                   output_loading_info=True)
    assert type(ref).__name__ == arch and not info["missing_keys"] and not info["unexpected_keys"]
    ids, mask = padded_batch([6, 11, 3], "right", seed=2, vocab=VOCAB)
    ours = np.asarray(drm.values(jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_allclose(torch_scores(ref.eval(), ids, mask), ours, atol=1e-4, rtol=0)


def test_gemma3_reads_both_config_layouts():
    """Gemma 3's RoPE and layer pattern from transformers 5's `rope_parameters` per layer type and from 4.x's
    `rope_theta` / `rope_local_base_freq` / `rope_scaling` / `sliding_window_pattern` give one `DecoderConfig`."""
    from rrc_jax.models.decoder_config import DecoderConfig

    common = dict(model_type="gemma3_text", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=7,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
                  sliding_window=4)
    v5 = DecoderConfig.from_hf(dict(common, layer_types=["sliding_attention"] * 5 + ["full_attention"] * 2,
                                    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                     "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                        "rope_theta": 1e6}}))
    v4 = DecoderConfig.from_hf(dict(common, sliding_window_pattern=6, rope_theta=1e6, rope_local_base_freq=1e4,
                                    rope_scaling={"rope_type": "linear", "factor": 8.0}))
    assert v4.sliding[:6] == v5.sliding[:6] == (True,) * 5 + (False,)
    assert v4.sliding[6] and not v5.sliding[6]  # the pattern repeats; a listed layer type wins
    for cfg in (v4, v5):
        assert (cfg.rope_type, cfg.rope_scaling, cfg.rope_theta, cfg.local_rope_theta) == (
            "linear", (("factor", 8.0),), 1e6, 1e4)
        assert cfg.attn_logit_softcapping is None and cfg.final_logit_softcapping is None and cfg.qk_norm
    exported = v5.to_hf()
    assert exported["rope_parameters"]["sliding_attention"] == {"rope_type": "default", "rope_theta": 1e4}
    assert DecoderConfig.from_hf(exported) == v5


@pytest.mark.parametrize("kind", ["qwen2_tied", "qwen3_untied"])
def test_qwen_sliding_window_layers_match_transformers(tmp_path, kind):
    """Qwen2 / Qwen3 with `use_sliding_window` (the layers from `max_window_layers` on slide, window 4): logits on
    left- and right-padded rows and greedy continuations equal transformers', and the export keeps the windows."""
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM

    from conftest import padded_batch
    from rrc_jax.models import save_hf
    from test_sampling import gen, hf_greedy, prompts_of

    ref = make_hf_model(kind, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    ref.save_pretrained(tmp_path / "in")
    model = load_hf(tmp_path / "in")
    assert model.cfg.sliding == (False, True) and model.cfg.sliding_window == 4
    for side in ("left", "right"):
        ids, mask = padded_batch([12, 7, 3], side)
        with torch.no_grad():
            want = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
        got = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
        np.testing.assert_allclose(got[mask.astype(bool)], want[mask.astype(bool)], atol=1e-4)
    ids, mask = padded_batch([5, 9], "left", seed=5)
    out = gen(model, prompts_of(ids, mask), max_new_tokens=12, temperature=0.0)
    expected = hf_greedy(ref, ids, mask, 12, eos=2)
    for b in range(2):
        np.testing.assert_array_equal(out.tokens[b, :out.lengths[b]], expected[b, :out.lengths[b]])
    save_hf(model, tmp_path / "out")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    assert again.config.layer_types == ["full_attention", "sliding_attention"] and again.config.sliding_window == 4
