"""The toy task: sort a short list of digits.

A prompt x is the digits followed by `>` (e.g. `31415>`); a response o is the digits in some order followed by EOS
(e.g. `11345`). The oracle quality `q(x, o)` (Eq. 6) is the fraction of positions that hold the right digit of the
sorted answer (graded, not binary, so margins matter); a response of the wrong length is compared over the sorted
answer's length, extra or missing positions counting as wrong.

The toy judge (a GRM trained with Eq. 2, `toy_pairwise_cot` template) reasons before its verdict: it writes the
sorted answer, then for each response the number of correct positions, then `[[A]]` or `[[B]]`:

    sort: 31415>            <- shared prefix (the prompt)
    A: 13145                <- the pair
    B: 11345
    think: 11345 a2 b5 [[B]]  <- the judge's chain of thought and verdict

Because the verdict follows the reasoning deterministically, P(verdict) saturates: PRC's probability collapse
(Table 6) appears naturally.
"""

from __future__ import annotations

import dataclasses

import numpy as np

DIGITS = "0123456789"
# Characters of every toy text: the task, the toy judge templates and their reasoning.
ALPHABET = DIGITS + " \n>:[]ABabcdehiknorstv"


def parse_digits(text: str) -> str:
    """The digits of a response, stopping at the first character that is not a digit."""
    out = []
    for ch in text.strip():
        if ch not in DIGITS:
            break
        out.append(ch)
    return "".join(out)


def oracle_quality(prompt_digits: str, response: str) -> float:
    """`q(x, o)` in [0, 1]: positions of `response` holding the digit of `sorted(prompt_digits)` at that position,
    over the longer of the two lengths."""
    target = "".join(sorted(prompt_digits))
    resp = parse_digits(response)
    if not target:
        return 0.0
    hits = sum(a == b for a, b in zip(target, resp))
    return hits / max(len(target), len(resp))


def toy_judgment(prompt_digits: str, a: str, b: str) -> str:
    """The toy judge's reasoning and verdict for a pair: `' <sorted> a<hits> b<hits> [[A|B]]'`.

    Ties (equal hits) go to A: the judge must still choose, and A/B swapping in the engine removes the bias.
    """
    target = "".join(sorted(prompt_digits))
    ha = sum(x == y for x, y in zip(target, parse_digits(a)))
    hb = sum(x == y for x, y in zip(target, parse_digits(b)))
    qa, qb = oracle_quality(prompt_digits, a), oracle_quality(prompt_digits, b)
    return f" {target} a{ha} b{hb} [[{'A' if qa >= qb else 'B'}]]"


@dataclasses.dataclass(frozen=True)
class SortTask:
    """Prompts of `min_len`..`max_len` digits, and noisy demonstrations for the initial policy's SFT.

    A demonstration is the sorted answer with, with probability `noise`, each of 1-3 random corruptions: swap two
    positions, replace a digit, drop a digit. The policy pre-trained on them starts mediocre and diverse.
    """

    min_len: int = 4
    max_len: int = 6
    noise: float = 0.7

    def prompt(self, rng: np.random.Generator) -> str:
        """The digits of one prompt, e.g. `'31415'` (the policy sees `prompt_text(digits)`)."""
        n = int(rng.integers(self.min_len, self.max_len + 1))
        return "".join(rng.choice(list(DIGITS), n))

    @staticmethod
    def prompt_text(digits: str) -> str:
        return f"{digits}>"

    def demonstration(self, digits: str, rng: np.random.Generator) -> str:
        out = list(sorted(digits))
        if rng.random() < self.noise:
            for _ in range(int(rng.integers(1, 4))):
                kind = rng.integers(3)
                i, j = rng.integers(len(out)), rng.integers(len(out))
                if kind == 0:
                    out[i], out[j] = out[j], out[i]
                elif kind == 1:
                    out[i] = str(rng.integers(10))
                elif len(out) > 1:
                    del out[i]
        return "".join(out)
