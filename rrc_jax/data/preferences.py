"""Preference data: the records every reward-model recipe and the evaluator read.

A `Preference` is one judged pair: `chosen` is better than `rejected` for `prompt`. The loaders that turn the
benchmarks' files into them (HelpSteer3, RM-Bench, JudgeBench, a generic pairs file) live in this module.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Preference:
    """One preference example: `chosen` is better than `rejected` for `prompt`.

    rationale: judge reasoning to imitate before the verdict (GRM SFT), "" when the data has none.
    strength: how strongly the annotators prefer `chosen` (HelpSteer3's |overall_preference|, 1..3; the Bradley-Terry
      margin), 0 when the data does not say.
    key: where the example comes from, `FILE:ROW` (the 9 style pairs of an RM-Bench row share it).
    domain: the dataset's domain / category ("" when it has none).
    style: RM-Bench's (chosen style, rejected style), each 0 (concise), 1 (detailed), 2 (detailed, markdown); None
      elsewhere.
    """

    prompt: str
    chosen: str
    rejected: str
    rationale: str = ""
    strength: int = 0
    key: str = ""
    domain: str = ""
    style: tuple[int, int] | None = None
