"""Hugging Face interop: transformers' sequence-classification reward models as the DRM, the DRM export read back by
`AutoModelForSequenceClassification`, and `save_hf`'s generation config and tokenizer (stop tokens, the CLI)."""

import json
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors import safe_open

from conftest import KINDS, TINY, make_hf_model, padded_batch
from rrc_jax.config import base_config, validate
from rrc_jax.errors import ConfigError
from rrc_jax.inference.kernels import SamplingParams, generate
from rrc_jax.models import Decoder, DecoderConfig, load_hf, load_tokenizer, prompt_ids, save_hf
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.constructions.drm import DRMReward
from rrc_jax.rl.roles import Roles
from rrc_jax.rm.examples import scored_ids

VOCAB = 112  # covers the character tokenizer's ids (4 special + 100 characters)
PROMPTS = ["Sort: 3 1 2", "Sort: b a", "hi"]
RESPONSES = ["1 2 3", "a b and more words to pad the others", "!"]


def make_hf_classifier(kind: str, seed: int = 0, **overrides):
    """A tiny random transformers `*ForSequenceClassification` (one label, float32, eval mode) of a `KINDS` family."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    model_type, extra = KINDS[kind]
    kwargs = {**TINY, **extra, "vocab_size": VOCAB, "num_labels": 1, **overrides}
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(model_type, **kwargs))
    with torch.no_grad():  # random init leaves biases at zero and norms at one; make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def torch_scores(model, ids, mask) -> np.ndarray:
    """transformers' pooled scores `[B]` of `ids [B, T]` (padded with the model's pad id), `mask [B, T]`."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor(np.asarray(ids), dtype=torch.long),
                    attention_mask=torch.tensor(np.asarray(mask), dtype=torch.long))
    return out.logits[:, 0].float().numpy()


def tensor_names(path) -> set[str]:
    with safe_open(path / "model.safetensors", framework="numpy") as f:
        return set(f.keys())


def right_padded(rows, pad: int) -> tuple[np.ndarray, np.ndarray]:
    t = max(map(len, rows))
    ids = np.array([list(r) + [pad] * (t - len(r)) for r in rows], np.int32)
    mask = np.array([[1] * len(r) + [0] * (t - len(r)) for r in rows], np.int32)
    return ids, mask


# pad 2 is also EOS (as many Llama reward models): the rows end in EOS, which transformers does not score
@pytest.mark.parametrize("kind,pad", [("llama3_untied", 2), ("qwen2_tied", 0), ("qwen3_untied", 0),
                                      ("mistral_window", 0), ("gemma2_tied", 0), ("gemma3_tied", 0)])
def test_transformers_sequence_classifier_is_the_drm(tmp_path, kind, pad):
    ref = make_hf_classifier(kind, pad_token_id=pad)
    ref.save_pretrained(tmp_path)
    make_char_tokenizer().save_pretrained(tmp_path)
    assert "lm_head.weight" not in tensor_names(tmp_path)
    config = base_config("drm")
    config.models.drm = str(tmp_path)
    roles = Roles.of_run(validate(config))
    drm = roles.model("drm")
    assert drm.cfg.value_head and not drm.cfg.lm_head and drm.cfg.pad_token_id == pad
    # the reward: each (prompt, response) rendered with the DRM's tokenizer, right-padded with its pad id
    tok = roles.tokenizer("drm")
    ours = DRMReward(drm, tok).scores(PROMPTS, RESPONSES)
    rows = [scored_ids(tok, p, o) for p, o in zip(PROMPTS, RESPONSES)]
    assert all(r[-1] == 2 for r in rows)  # EOS last
    np.testing.assert_allclose(ours, torch_scores(ref, *right_padded(rows, pad)), atol=1e-4, rtol=0)
    # a real token equal to the pad id in the middle of a row is read like any other
    ids, mask = padded_batch([6, 11, 3], "right", seed=1, vocab=VOCAB, pad_id=pad)
    ids[1, 2] = pad
    np.testing.assert_allclose(np.asarray(drm.values(jnp.asarray(ids), jnp.asarray(mask))),
                               torch_scores(ref, ids, mask), atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="no LM head"):
        drm(jnp.asarray(ids), jnp.asarray(mask))


def test_sequence_classifier_is_refused_as_policy_and_with_two_labels(tmp_path):
    make_hf_classifier("llama3_tied").save_pretrained(tmp_path / "rm")
    config = base_config("drm")
    config.models.policy = str(tmp_path / "rm")
    with pytest.raises(ConfigError, match=r"models.policy: .* is a sequence-classification .*models.drm only"):
        Roles.of_run(validate(config)).model("reference")
    make_hf_classifier("llama3_tied", num_labels=2).save_pretrained(tmp_path / "two")
    with pytest.raises(ConfigError, match=r"two/config.json: a sequence classifier with 2 labels.*num_labels=1"):
        load_hf(tmp_path / "two")


def tiny_drm(model_type: str) -> Decoder:
    """A random untied DRM (an LM head and a value head) with pad id 0, as `train_rm` holds it before export."""
    cfg = DecoderConfig(model_type=model_type, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=model_type == "qwen2",
                        qk_norm=model_type == "qwen3", value_head=True,
                        bos_token_id=1, eos_token_ids=(2,), pad_token_id=0)
    model = Decoder(cfg, rngs=nnx.Rngs(3))
    model.value_head.kernel.value = jnp.asarray(np.random.default_rng(0).normal(size=32), jnp.float32)
    return model


@pytest.mark.parametrize("model_type,arch", [("llama", "LlamaForSequenceClassification"),
                                             ("qwen2", "Qwen2ForSequenceClassification"),
                                             ("qwen3", "Qwen3ForSequenceClassification")])
def test_drm_export_loads_with_auto_model_for_sequence_classification(tmp_path, model_type, arch):
    from transformers import AutoModelForSequenceClassification

    drm = tiny_drm(model_type)
    save_hf(drm, tmp_path, tokenizer=make_char_tokenizer())
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == [arch] and hf["pad_token_id"] == 0 and len(hf["id2label"]) == 1
    assert "score.weight" in tensor_names(tmp_path) and "lm_head.weight" not in tensor_names(tmp_path)
    assert not (tmp_path / "generation_config.json").exists()
    ref, info = AutoModelForSequenceClassification.from_pretrained(tmp_path, dtype=torch.float32,
                                                                   output_loading_info=True)
    assert type(ref).__name__ == arch and ref.config.num_labels == 1
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids, mask = padded_batch([6, 11, 3], "right", seed=2, vocab=VOCAB)
    ours = np.asarray(drm.values(jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_allclose(torch_scores(ref.eval(), ids, mask), ours, atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(load_hf(tmp_path).values(jnp.asarray(ids), jnp.asarray(mask))), ours,
                               atol=1e-6)


def test_drm_export_needs_a_pad_id(tmp_path):
    drm = tiny_drm("llama")
    no_pad = Decoder(drm.cfg.replace(pad_token_id=None), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"no pad id.*load_hf\(\.\.\., pad_token_id=ID\)"):
        save_hf(no_pad, tmp_path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A transformers causal LM read by `load_hf` and written by `save_hf` with a tokenizer read by
    `load_tokenizer` (which loads with local_files_only)."""
    root = tmp_path_factory.mktemp("interop")
    make_hf_model("llama3_untied", vocab_size=VOCAB).save_pretrained(root / "in")  # untied: greedy does not echo
    make_char_tokenizer().save_pretrained(root / "in")
    save_hf(load_hf(root / "in"), root / "out", tokenizer=load_tokenizer(root / "in"))
    return root / "out"


def test_save_hf_writes_generation_config_and_a_clean_tokenizer(exported, tmp_path):
    from transformers import AutoTokenizer, GenerationConfig

    gen = GenerationConfig.from_pretrained(exported)
    assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (1, 2, 0)
    assert "local_files_only" not in json.loads((exported / "tokenizer_config.json").read_text())
    assert len(AutoTokenizer.from_pretrained(exported)) == len(make_char_tokenizer())
    # load_hf: the stop tokens are generation_config.json's eos_token_id, one id or a list
    for eos, stop in ((9, (9,)), ([2, 9], (2, 9))):
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
        for f in ("config.json", "model.safetensors"):
            (tmp_path / f).write_bytes((exported / f).read_bytes())
        assert load_hf(tmp_path).cfg.eos_token_ids == stop
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(ConfigError, match=r"generation_config.json: .*eos_token_id"):
        load_hf(tmp_path)


def test_generate_cli_runs_on_save_hf_output_and_stops_on_generation_config_stop_token(exported):
    """A stop token that only `generation_config.json` names (not the tokenizer's EOS) ends the CLI's generation."""
    tok, model = load_tokenizer(exported), load_hf(exported)
    ids = prompt_ids(tok, "Sort: 3 1 2")
    free = generate(model, [ids], SamplingParams(0.0, max_new_tokens=12, stop_token_ids=())).tokens[0].tolist()
    at = next(i for i, t in enumerate(free) if i >= 2 and 4 <= t < len(tok) and t not in free[:i])  # a character
    gen_file = exported / "generation_config.json"
    gen_file.write_text(json.dumps({**json.loads(gen_file.read_text()), "eos_token_id": [2, free[at]]}))
    out = subprocess.run([sys.executable, "-m", "rrc_jax.generate", f"--model={exported}", "--prompt=Sort: 3 1 2",
                          "--max_new_tokens=12"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == tok.decode(free[:at + 1], skip_special_tokens=True) + "\n"
    assert at + 1 < len(free)  # it stopped early


def test_broken_checkpoints_are_one_line_errors_naming_the_file(tmp_path):
    """A truncated safetensors file, a config.json without vocab_size, and NaN weights: each a `ConfigError` naming
    the file, before any model is built from it."""
    from safetensors.numpy import load_file, save_file

    good = tmp_path / "good"
    make_hf_model(next(iter(KINDS)), seed=1).save_pretrained(good)
    load_hf(good)  # as written, it loads

    def copy(name):
        import shutil

        return shutil.copytree(good, tmp_path / name)

    truncated = copy("truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    with pytest.raises(ConfigError, match=f"^{weights}: .*(not a readable safetensors file|does not read)"):
        load_hf(truncated)
    no_vocab = copy("no_vocab")
    cfg = json.loads((no_vocab / "config.json").read_text())
    del cfg["vocab_size"]
    (no_vocab / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=f"^{no_vocab / 'config.json'}: no vocab_size"):
        load_hf(no_vocab)
    nan = copy("nan")
    tensors = load_file(nan / "model.safetensors")
    name = next(k for k in tensors if k.endswith("mlp.down_proj.weight"))
    tensors[name][0, 0] = np.nan
    save_file(tensors, nan / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=f"^{nan / 'model.safetensors'}: tensor {name} holds NaN or inf"):
        load_hf(nan)


def test_a_generic_tokenizer_loads_without_the_auto_classes(tmp_path):
    """`load_tokenizer` imports the generic `tokenizers` backend directly when `tokenizer_config.json` names it (what
    `AutoTokenizer` resolves to anyway; it spares a command importing torch), and `AutoTokenizer` for any other
    class: the same class and the same ids either way."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from rrc_jax.models.hf_io import _tokenizer_class

    make_char_tokenizer().save_pretrained(tmp_path / "generic")
    assert _tokenizer_class(tmp_path / "generic") is PreTrainedTokenizerFast
    ours, auto = load_tokenizer(tmp_path / "generic"), AutoTokenizer.from_pretrained(tmp_path / "generic")
    assert type(ours) is type(auto) and ours("sort 31").input_ids == auto("sort 31").input_ids
    (tmp_path / "named").mkdir()
    for f in (tmp_path / "generic").iterdir():
        (tmp_path / "named" / f.name).write_bytes(f.read_bytes())
    config = tmp_path / "named" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "tokenizer_class": "LlamaTokenizer"}))
    assert _tokenizer_class(tmp_path / "named") is AutoTokenizer
