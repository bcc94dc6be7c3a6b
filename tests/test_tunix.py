"""tunix's GRPOLearner trains two steps with `rrc_jax.integrations.tunix.TunixReward` (`examples/tunix_rewards.py`),
in the tunix environment `.ci/tunix_env` makes (a virtual environment over this one that holds google-tunix 0.1.7
and the releases it pins: `safetensors<0.8` moves transformers, tokenizers and huggingface_hub back there only;
`.ci/run` makes it). Each call's rewards are `scr_rewards` of the vote counts read from the judge's own trace, tunix
logs their mean, and the policy's weights move."""

import importlib.util
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rrc_jax.rewards import scr_rewards

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("peers", REPO / "benchmarks" / "peers.py")
peers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)
tunix_python = peers.tunix_python  # `$RRC_TUNIX_PYTHON`, else the repository's `.venv-tunix/bin/python`


@pytest.mark.skipif(tunix_python() is None, reason="no tunix environment: bash .ci/tunix_env (.ci/run makes it)")
def test_tunix_grpo_trains_two_steps_with_rrc_rewards(tmp_path, toy_cache):
    out = tmp_path / "tunix.json"
    run = subprocess.run([str(tunix_python()), str(REPO / "examples" / "tunix_rewards.py"), f"--toy_cache={toy_cache}",
                          f"--record={out}"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    calls, g = result["calls"], 4
    assert result["steps"] == 2 and len(calls) == 2 and result["moved"] > 0
    for call in calls:
        assert call["num_generations"] == g and len(call["completions"]) == 2 * g  # tunix passed G itself
        prompts = call["prompts"]
        assert all(len(set(prompts[i:i + g])) == 1 for i in range(0, len(prompts), g))
        counts = np.zeros((len(prompts) // g, g, g), np.int32)
        for t in call["trace"]:
            if t["winner"]:
                i, j = (t["i"], t["j"]) if t["winner"] == "a" else (t["j"], t["i"])
                counts[t["prompt"], i, j] += 1
        expected = np.asarray(scr_rewards(counts, alpha=0.1, ties="zero")).reshape(-1)
        np.testing.assert_allclose(call["rewards"], expected, atol=1e-6)
    np.testing.assert_allclose(result["logged_reward_sums"], [np.mean(c["rewards"]) for c in calls], atol=1e-6)
    assert any(np.ptp(c["rewards"]) > 0 for c in calls)
