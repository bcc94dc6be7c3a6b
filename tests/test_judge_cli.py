"""`python -m rrc_jax.judge` prints every vote's reasoning and verdict, then the tally."""

import subprocess
import sys

import pytest

from conftest import make_hf_model
from rrc_jax.inference import make_sampler
from rrc_jax.judge import Judge
from rrc_jax.models import load_hf, load_tokenizer
from rrc_jax.models.char_tokenizer import make_char_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("judge_cli_model")
    make_hf_model("qwen2_tied", seed=4, vocab_size=112).save_pretrained(path)
    make_char_tokenizer().save_pretrained(path)
    return path


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "rrc_jax.judge", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_prints_votes_and_tally(model_dir):
    out = run_cli(f"--model={model_dir}", "--prompt=sort 3 1 2", "--a=1 2 3", "--b=3 2 1", "--votes=3",
                  "--template=toy_pairwise_cot", "--max_new_tokens=10", "--temperature=0")
    assert out.returncode == 0, out.stderr[-2000:]
    tok = load_tokenizer(model_dir)
    judge = Judge(make_sampler("grm", load_hf(model_dir), tok), tok, template="toy_pairwise_cot", max_new_tokens=10,
                  temperature=0.0)
    votes, log = judge.explain(["sort 3 1 2"], ["1 2 3"], ["3 2 1"], votes=3)
    lines = out.stdout
    for v in log:
        assert f"=== vote {v.vote + 1}/3 ({'A = b, B = a (swapped)' if v.swapped else 'A = a, B = b'}) ===\n" \
               f"{v.text}\n" in lines
    assert lines.count("--- verdict:") == 3
    assert lines.rstrip().splitlines()[-1] == (f"tally: a {votes.wins[0]}, b {votes.losses[0]}, "
                                               f"abstain {votes.abstains[0]}")


def test_cli_unknown_template_is_one_line(model_dir):
    out = run_cli(f"--model={model_dir}", "--prompt=x", "--a=1", "--b=2", "--template=nope")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("error: unknown judge template 'nope'")
