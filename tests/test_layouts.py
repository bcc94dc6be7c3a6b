"""A layout per role: the inference layout (tensor-parallel, rows over the data axes) against the
training layout, on 8 CPU devices (a subprocess, `layout_parity.py`)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cpu_devices_env

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def result():
    out = subprocess.run([sys.executable, str(HERE / "layout_parity.py")], env=cpu_devices_env(8),
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_inference_layout_decodes_and_judges_as_one_device(result):
    """Greedy rollouts, judge verdicts and their texts token-identical, log-probs within 1e-4, on (1, 2, 4) and
    (2, 1, 4) with 2 kv heads under 4-way tensor parallelism (replicated); the rollout copy after `update_weights`
    equals a fresh copy of the new weights (the checks raise inside the script)."""
    assert [p["mesh"] for p in result["parity"]] == [[1, 2, 4], [2, 1, 4]]
    assert all(p["weight_sync_bytes"] > 0 for p in result["parity"])


def test_no_weight_is_gathered_in_the_inference_decode_step(result):
    """The compiled decode step (the sampler's `lax.while_loop`) of the rollout and of the judge (a branched cache
    of shared prefixes) holds no all-gather of a weight in the inference layout, while the training layout (FSDP
    over 8) gathers every weight matrix at every step: the check catches exactly the regression it guards against.

    A weight gather is a collective whose result holds as many elements as a weight matrix (a layer's, or the
    whole stack); what a decode step moves otherwise is activations of 16 rows."""
    gathers = result["gathers"]
    assert len(gathers["train_fsdp8"]["rollout"]) >= 5 and len(gathers["train_fsdp8"]["judge"]) >= 5, gathers
    for name in ("inference_1x2x4", "inference_2x1x4", "inference_4x1x2"):
        assert gathers[name]["rollout"] == [] and gathers[name]["judge"] == [], (name, gathers[name])


def test_only_activations_cross_chips_in_the_inference_decode_step(result):
    """Every all-gather and all-reduce of the inference layout's decode step, for the rollout and for the judge's
    branched cache, with kv heads split over tensor (4x1x2) or replicated (2 kv heads on tensor 4), is at most a
    `[rows, embed]` activation on a device (16 rows over at least 2 row groups, embed 128): the all-reduces after
    each attention and MLP and the logits' reductions. Never a weight, never the KV cache: before the attention
    output was pinned to its kv heads, XLA split the attention by query heads to suit the output projection and
    gathered each layer's cache block at every step (e.g. [8, 2, 32, 64] on (2, 1, 4))."""
    for name in ("inference_1x2x4", "inference_2x1x4", "inference_4x1x2"):
        for part in ("all_rollout", "all_judge"):
            shapes = result["gathers"][name][part]
            assert shapes and max(math.prod(s) for s in shapes) <= 8 * 128, (name, part, shapes)
