"""`python -m rrc_jax.generate` prints only the continuation on stdout; errors are one line."""

import subprocess
import sys

import numpy as np
import pytest

from conftest import KINDS, make_hf_model
from rrc_jax.models import prompt_ids
from rrc_jax.models.char_tokenizer import make_char_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_model")
    make_hf_model("qwen2_tied", seed=4, vocab_size=112).save_pretrained(path)
    make_char_tokenizer().save_pretrained(path)
    return path


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "rrc_jax.generate", *args], capture_output=True, text=True,
                          timeout=300)


FIRST_OF_EACH_FAMILY = sorted({model_type: kind for kind, (model_type, _) in reversed(KINDS.items())}.values())
# The command line is the same for every family and each family's greedy decoding is checked against transformers
# in-process (test_sampling.py): two families here, the others under the slow marker (`pytest -m slow`).
IN_THE_SUITE = ("llama3_untied", "gemma3_tied")


@pytest.mark.parametrize("kind", [k if k in IN_THE_SUITE else pytest.param(k, marks=pytest.mark.slow)
                                  for k in FIRST_OF_EACH_FAMILY])
def test_cli_greedy_text_is_transformers_greedy_text(tmp_path, kind):
    """`generate --temperature=0` on a tiny checkpoint of each family (its first test config) prints only the
    continuation, the text of transformers' own greedy `generate` on the same checkpoint (BOS from the fallback
    prompt format: no chat template)."""
    import torch

    ref = make_hf_model(kind, seed=4, vocab_size=112)
    ref.save_pretrained(tmp_path)
    tok = make_char_tokenizer()
    tok.save_pretrained(tmp_path)
    out = run_cli(f"--model={tmp_path}", "--prompt=Sort: 3 1 2", "--max_new_tokens=12", "--temperature=0")
    assert out.returncode == 0, out.stderr[-2000:]
    ids = torch.tensor([prompt_ids(tok, "Sort: 3 1 2")])
    assert ids[0, 0] == 1
    with torch.no_grad():
        want = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                            eos_token_id=2, pad_token_id=0)[0, ids.shape[1]:].tolist()
    assert out.stdout == tok.decode(want, skip_special_tokens=True) + "\n"


def test_cli_sampling_flags_and_seed(model_dir):
    args = [f"--model={model_dir}", "--prompt=abc", "--max_new_tokens=8", "--temperature=1.0", "--top_p=0.9"]
    a, b = run_cli(*args, "--seed=1"), run_cli(*args, "--seed=1")
    assert a.returncode == 0 and a.stdout == b.stdout


def test_cli_missing_config_is_one_line(tmp_path):
    out = run_cli(f"--model={tmp_path}", "--prompt=hi")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("error:") and "config.json" in out.stderr
    assert out.stdout == ""


def test_chat_template_is_used_when_present(model_dir):
    tok = make_char_tokenizer()
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}" \
                        "{% if add_generation_prompt %}<assistant>{% endif %}"
    ids = prompt_ids(tok, "hi", system="be brief")
    assert tok.decode(ids) == "<system>be brief\n<user>hi\n<assistant>"
    assert np.count_nonzero(np.array(ids) == 1) == 0  # no BOS added on top of the template


def test_a_nan_temperature_is_one_line(model_dir):
    """`--temperature=nan` passed `temperature < 0` and printed an empty text with exit 0."""
    out = run_cli(f"--model={model_dir}", "--prompt=hi", "--temperature=nan")
    assert out.returncode != 0 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()[-1:]
    assert line.startswith("error:") and "temperature=nan must be a finite number" in line


def test_a_tokenizer_larger_than_the_vocabulary_is_one_line(tmp_path):
    """Ids past the model's vocabulary would index past its embedding (clamped silently)."""
    tok = make_char_tokenizer()
    make_hf_model("qwen2_tied", vocab_size=len(tok) - 8).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    out = run_cli(f"--model={tmp_path}", "--prompt=hi")
    assert out.returncode != 0 and out.stdout == ""
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("error:") and f"the tokenizer's largest id is {len(tok) - 1} ({len(tok)} ids) but the model's vocabulary" in line
