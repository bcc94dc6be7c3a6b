"""Sample dumps: what the policy wrote and why the reward scored it so, for a few prompts of a step.

Every `log.samples_every` steps, and at step 1, the trainer writes `workdir/samples/step_N.jsonl`: one line per
prompt (the first `log.samples_prompts` of process 0's share of the step), holding

- `step`, `prompt_index` (into the training prompt set), `prompt`;
- `responses`: for each response `i`, its `text`, `reward`, GRPO `advantage` and (toy world) `oracle_quality`;
- `judgments`: every judgment behind those rewards, as the judge traced them (`rrc_jax.judge.judge`, "Tracing"):
  the responses it concerns (`i`, and `j` or `anchor`), `vote`, `swapped` (B was shown first), the judge's `text`,
  its `verdict` as shown and the `winner` in the record's own order (`a` = response i), or `null` when the judge
  abstained; PRC's records carry `p_a`, pointwise ones `score`;
- what the responses were compared against (`reference` for PRC, `anchors` for AGR).

A reward recomputed from `judgments` with `rrc_jax.rewards` equals the logged `reward` (tests/test_train.py).
The dump is bounded: `samples_prompts` prompts, each with its m responses and their judgments.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from etils import epath

from rrc_jax.metrics import json_value
from rrc_jax.settings import field_error


@dataclasses.dataclass(frozen=True)
class SamplesConfig:
    """What a run dumps (`log`): `samples_prompts` prompts of step 1 and of every `samples_every` steps (0: never)."""

    GROUP: ClassVar[str] = "log"
    samples_every: int = 10
    samples_prompts: int = 4

    def __post_init__(self):
        for name in ("samples_every", "samples_prompts"):
            if getattr(self, name) < 0:
                raise field_error("log", name, f"{getattr(self, name)} must be >= 0 (0 = off)")


def samples_due(step: int, every: int) -> bool:
    """Whether step `step` (1-based) dumps its samples: step 1 and every `every` steps (`every` 0: never)."""
    return every > 0 and (step == 1 or step % every == 0)


def sample_records(step: int, prompts: Sequence[str], prompt_index: Sequence[int],
                   responses: Sequence[Sequence[str]], rewards: np.ndarray, advantages: np.ndarray, *,
                   judgments: Sequence[dict] = (), notes: Sequence[dict] = (), quality: np.ndarray | None = None,
                   limit: int) -> list[dict]:
    """One record per prompt for the first `limit` of B prompts.

    Args:
      prompts, prompt_index: `[B]` the step's prompts and their indices in the training set.
      responses: `[B][m]` texts; `rewards`, `advantages`, `quality`: `[B, m]`.
      judgments: trace records, each with `prompt` (its index b among the B prompts).
      notes: `[B]` dicts merged into each prompt's record (`RewardResult.notes`).
    """
    out = []
    for b in range(min(limit, len(prompts))):
        rows = [{"i": i, "text": text, "reward": json_value(rewards[b, i]),
                 "advantage": json_value(advantages[b, i]),
                 **({} if quality is None else {"oracle_quality": json_value(quality[b, i])})}
                for i, text in enumerate(responses[b])]
        out.append({"step": step, "prompt_index": int(prompt_index[b]), "prompt": prompts[b], "responses": rows,
                    **(notes[b] if b < len(notes) else {}),
                    "judgments": [{k: v for k, v in j.items() if k != "prompt"} for j in judgments
                                  if j["prompt"] == b]})
    return out


def write_samples(workdir: epath.Path, step: int, records: Sequence[dict]) -> epath.Path:
    """`records` to `workdir/samples/step_<step>.jsonl` (one JSON object per line); returns the path."""
    path = epath.Path(workdir) / "samples" / f"step_{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in records))
    return path
