"""Model families as plug-ins (issue 28): the registry, and end-to-end runs on a family other than Llama / Qwen2
(Qwen3). Logit, greedy, export and sequence-classifier parity with transformers run for every family's test configs
in test_models.py, test_sampling.py, test_generate_cli.py and test_hf_interop.py (their kinds come from the
registry)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import KINDS, TINY, cpu_devices_env, make_hf_model
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
    with pytest.raises(ValueError, match="supported: llama, qwen2, qwen3"):
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


@pytest.mark.slow  # sharded training: test_mesh and test_train; Qwen3 itself: the parity tests and the DRM fit below
def test_two_step_run_with_a_qwen3_policy_and_judge_on_8_devices(tmp_path):
    """`python -m rrc_jax.train` (SCR) with a tiny Qwen3 policy and a tiny Qwen3 GRM, sharded over 8 CPU devices,
    finishes its two steps and exports a Qwen3 checkpoint."""
    tokenizer = make_char_tokenizer()
    for role, seed in (("policy", 1), ("grm", 2)):
        make_hf_model("qwen3_untied", seed=seed, vocab_size=len(tokenizer),
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
    from rrc_jax.train_rm import run_rm

    workdir = tmp_path / "drm"
    export = run_rm(rm("drm", workdir, pairs_file(tmp_path / "pairs.jsonl"), tmp_path / "init", **{"train.steps": 1}))
    assert [r["step"] for r in metrics(workdir)][-1] == 1
    exported = json.loads((export / "config.json").read_text())
    assert exported["architectures"] == ["Qwen3ForSequenceClassification"]
    assert load_hf(export).cfg.value_head and load_hf(export).cfg.qk_norm
