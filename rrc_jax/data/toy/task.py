"""The toy task: sort a short list of digits.

A prompt x is the digits followed by `>` (e.g. `31415>`); a response o is the digits in some order followed by EOS
(e.g. `11345`). The oracle quality `q(x, o)` (Eq. 6) is the fraction of the sorted answer's positions that hold
the right digit, one position deducted per extra digit (graded, not binary, so margins matter; missing digits
cost their positions, and padding never pays).

The toy judge (a GRM trained with Eq. 2, `toy_pairwise_cot` template) reasons before its verdict: it writes the
sorted answer, then for each response its score (correct positions minus extra digits), then `[[A]]` or `[[B]]`:

    sort: 31415>            <- shared prefix (the prompt)
    A: 13145                <- the pair
    B: 11345
    think: 11345 a2 b5 [[B]]  <- the judge's chain of thought and verdict

The toy GRM learns this judgment from an imperfect `Annotator` (docs/design.md, the toy world), not from the oracle: it
miscounts, favours position A on close calls and, half the time, credits a response's extra digits instead of
deducting them (a bias toward longer answers a policy can exploit). Its written scores, not the true ones, decide
its verdict, so the reasoning and the verdict stay consistent: P(verdict) saturates once the scores are written
(PRC's probability collapse, Table 6), while the judgments vary from one sample to the next.

Prompts are split once and for all: a fixed eighth of all digit strings (`is_held_out`) is only ever drawn for
evaluation, the rest for every model's training and the RL prompts; `held_out_prompt_count` says how many distinct
evaluation prompts there are (138,750 of 4-6 digits).

The toy pointwise judge (IRPO's kind, `toy_pointwise` template) scores one response the same way:

    sort: 31415>
    A: 11345
    think: 11345 score: 5   <- the sorted answer, then the response's score (`parse_score` reads it)
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import ClassVar

import numpy as np

from rrc_jax.data.preferences import Preference
from rrc_jax.errors import ConfigError

DIGITS = "0123456789"
HELD_OUT_BUCKETS = 8  # one in 8 digit strings is an evaluation prompt only
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


def is_held_out(digits: str) -> bool:
    """Whether the prompt `digits` belongs to the evaluation split (a fixed hash bucket): never trained on."""
    return zlib.crc32(digits.encode()) % HELD_OUT_BUCKETS == 0


def held_out_prompt_count(min_len: int, max_len: int) -> int:
    """How many distinct prompts of `min_len`..`max_len` digits the evaluation split has (`is_held_out`): the most
    distinct held-out prompts a toy run can draw.

    Exact without enumerating the strings: over strings of one length CRC-32 is affine in the input bits, so a
    string's bucket (the CRC's low bits: `HELD_OUT_BUCKETS` is a power of two) is that of the all-zero string XOR
    one term per position and digit; the count runs over the `HELD_OUT_BUCKETS` partial XORs, position by
    position."""
    mask = HELD_OUT_BUCKETS - 1
    assert HELD_OUT_BUCKETS & mask == 0, "the split's buckets are the CRC's low bits"
    total = 0
    for n in range(min_len, max_len + 1):
        zero = zlib.crc32(bytes(n))
        ways = [1] + [0] * mask  # ways[s]: strings so far whose terms XOR to s
        for i in range(n):
            terms = [(zlib.crc32(bytes(i) + d.encode() + bytes(n - i - 1)) ^ zero) & mask for d in DIGITS]
            nxt = [0] * HELD_OUT_BUCKETS
            for s, w in enumerate(ways):
                for t in terms:
                    nxt[s ^ t] += w
            ways = nxt
        total += ways[zero & mask]  # bucket 0: the terms cancel the all-zero string's low bits
    return total


def _hits_extras(prompt_digits: str, response: str) -> tuple[int, int]:
    """(positions of `response` that hold the sorted answer's digit, digits beyond the answer's length)."""
    target = "".join(sorted(prompt_digits))
    resp = parse_digits(response)
    return sum(a == b for a, b in zip(target, resp)), max(0, len(resp) - len(target))


def _score(prompt_digits: str, response: str) -> int:
    """Correct positions of `response` against the sorted answer, minus its digits beyond the answer's length
    (missing digits already cost their positions), at least 0."""
    hits, extras = _hits_extras(prompt_digits, response)
    return max(0, hits - extras)


def oracle_quality(prompt_digits: str, response: str) -> float:
    """`q(x, o)` in [0, 1] (Eq. 6): the share of the sorted answer's positions that `response` gets right, one
    position deducted per extra digit (so padding a response never pays)."""
    return _score(prompt_digits, response) / len(prompt_digits) if prompt_digits else 0.0


def toy_judgment(prompt_digits: str, a: str, b: str) -> str:
    """The toy judge's reasoning and verdict for a pair: `' <sorted> a<score> b<score> [[A|B]]'`, where a score
    is the number `oracle_quality` divides by the length: the verdict follows the written scores exactly.

    Ties go to A: the judge must still choose, and A/B swapping in the engine removes the bias.
    """
    target = "".join(sorted(prompt_digits))
    sa, sb = _score(prompt_digits, a), _score(prompt_digits, b)
    return f" {target} a{sa} b{sb} [[{'A' if sa >= sb else 'B'}]]"


@dataclasses.dataclass(frozen=True)
class Annotator:
    """The imperfect annotator whose judgments the toy GRM (and, through its verdicts, the toy DRM) learns from.

    Per judgment of a pair (A, B), in this order:
    1. with probability `length_bias` it credits digits beyond the answer's length as right instead of deducting
       them (for both responses): padding then wins against the judge while it costs oracle quality;
    2. each written score is off by one, up or down, with probability `miscount` (at least 0);
    3. on a close call (written scores within one), A's written score gains one with probability `position_bias`.
    The verdict follows the written scores, ties to A. `Annotator()` (all zero) writes `toy_judgment` exactly; the
    toy world's is `TOY_ANNOTATOR`.
    """

    miscount: float = 0.0
    position_bias: float = 0.0
    length_bias: float = 0.0

    def scores(self, prompt_digits: str, a: str, b: str, rng: np.random.Generator) -> tuple[int, int]:
        """The written scores of A and B."""
        credit = rng.random() < self.length_bias
        written = []
        for response in (a, b):
            hits, extras = _hits_extras(prompt_digits, response)
            s = hits + extras if credit else max(0, hits - extras)
            if rng.random() < self.miscount:
                s = max(0, s + (1 if rng.random() < 0.5 else -1))
            written.append(s)
        sa, sb = written
        if abs(sa - sb) <= 1 and rng.random() < self.position_bias:
            sa += 1
        return sa, sb

    def judgment(self, prompt_digits: str, a: str, b: str, rng: np.random.Generator) -> str:
        """`' <sorted> a<written score> b<written score> [[A|B]]'`, the verdict following the written scores."""
        sa, sb = self.scores(prompt_digits, a, b, rng)
        return f" {''.join(sorted(prompt_digits))} a{sa} b{sb} [[{'A' if sa >= sb else 'B'}]]"


def toy_score_judgment(prompt_digits: str, response: str) -> str:
    """The toy pointwise judge's reasoning and score for one response: `' <sorted> score: <score>'`, the score
    being the number `oracle_quality` divides by the length (0 .. the prompt's length)."""
    return f" {''.join(sorted(prompt_digits))} score: {_score(prompt_digits, response)}"


def bubble_passes(digits: str, k: int) -> str:
    """`digits` after `k` passes of bubble sort (k >= len - 1: sorted)."""
    out = list(digits)
    for _ in range(k):
        for i in range(len(out) - 1):
            if out[i] > out[i + 1]:
                out[i], out[i + 1] = out[i + 1], out[i]
    return "".join(out)


# The toy world's models (docs/design.md, the toy world): width, depth and training steps of each tiny Llama-style
# decoder.
# The DRM matches the GRM (backbone, steps, and the same pairs: the paper's matched setting).
TOY_MODELS = {"policy": dict(hidden=64, layers=2, steps=500), "grm": dict(hidden=96, layers=3, steps=1500),
              "drm": dict(hidden=96, layers=3, steps=1500),
              "pointwise": dict(hidden=96, layers=3, steps=400)}  # IRPO's starting point, built only for it
# The toy GRM's imperfect annotator (`rrc_jax.data.toy.task.Annotator`): probabilities of a miscount per written
# score, of favouring A on a close call, and of crediting padding instead of deducting it.
TOY_ANNOTATOR = dict(miscount=0.2, position_bias=0.25, length_bias=0.5)


@dataclasses.dataclass(frozen=True)
class ToyTaskConfig:
    """The toy task's prompts (`toy`): `train_prompts` drawn from `seed`, each of `min_len`..`max_len` digits; the
    initial policy's demonstrations corrupted with probability `noise` (`SortTask`)."""

    GROUP: ClassVar[str] = "toy"
    seed: int = 0
    min_len: int = 4
    max_len: int = 6
    noise: float = 0.3
    train_prompts: int = 2048

    def __post_init__(self):
        if self.train_prompts < 0 or not 1 <= self.min_len <= self.max_len:
            raise ConfigError(f"config.toy: need train_prompts >= 0 and 1 <= min_len <= max_len, got "
                              f"{self.train_prompts}, {self.min_len}, {self.max_len}")

    @property
    def task(self) -> SortTask:
        return SortTask(self.min_len, self.max_len, self.noise)


@dataclasses.dataclass(frozen=True)
class SortTask:
    """Prompts of `min_len`..`max_len` digits, and imperfect demonstrations for the initial policy's SFT.

    A demonstration is the prompt after k passes of bubble sort, k drawn with weights `passes` (k = 0 copies the
    input; the last weight is for a full sort), then, with probability `noise`, 1-2 random corruptions (swap two
    positions, replace a digit, drop a digit). Incomplete sorts are the most likely demonstrations, so the policy
    pre-trained on them is mediocre even when decoding greedily, and diverse when sampling; better responses exist
    in its distribution for RL to find.
    """

    min_len: int = 4
    max_len: int = 6
    noise: float = 0.3
    passes: tuple[float, ...] = (0.3, 0.3, 0.2, 0.2)

    def prompt(self, rng: np.random.Generator, held_out: bool = False) -> str:
        """The digits of one prompt of the training split (`held_out=False`) or of the evaluation split, e.g.
        `'31415'` (the policy sees `prompt_text(digits)`)."""
        while True:
            n = int(rng.integers(self.min_len, self.max_len + 1))
            digits = "".join(rng.choice(list(DIGITS), n))
            if is_held_out(digits) == held_out:
                return digits

    @staticmethod
    def prompt_text(digits: str) -> str:
        return f"{digits}>"

    def demonstration(self, digits: str, rng: np.random.Generator) -> str:
        w = np.asarray(self.passes, float)
        k = int(rng.choice(len(w), p=w / w.sum()))
        out = list(bubble_passes(digits, len(digits) if k == len(w) - 1 else k))
        if rng.random() < self.noise:
            for _ in range(int(rng.integers(1, 3))):
                kind = rng.integers(3)
                i, j = rng.integers(len(out)), rng.integers(len(out))
                if kind == 0:
                    out[i], out[j] = out[j], out[i]
                elif kind == 1:
                    out[i] = str(rng.integers(10))
                elif len(out) > 1:
                    del out[i]
        return "".join(out)


def sample_response(task: SortTask, digits: str, rng: np.random.Generator) -> str:
    """A demonstration, padded with 1-3 stray digits one time in four, so that reward models learn that padding
    costs (an RL policy tries it soon enough)."""
    out = task.demonstration(digits, rng)
    if rng.random() < 0.25:
        out += "".join(rng.choice(list(DIGITS), int(rng.integers(1, 4))))
    return out


def sample_pair(task: SortTask, rng: np.random.Generator, held_out: bool = False) -> tuple[str, str, str]:
    """A prompt (of the training split, or the evaluation split) and two distinct responses to it (possibly of
    equal quality)."""
    digits = task.prompt(rng, held_out)
    a = sample_response(task, digits, rng)
    b = sample_response(task, digits, rng)
    while b == a:
        b = sample_response(task, digits, rng)
    return digits, a, b


def toy_preferences(task: SortTask, n: int, rng: np.random.Generator, held_out: bool = False,
                    name: str = "toy") -> list[Preference]:
    """`n` preference pairs of the toy task whose responses differ in oracle quality (the better one chosen, by the
    oracle), on prompts of the training split or, with `held_out`, of the evaluation split; `key` `f"{name}:{i}"`."""
    out: list[Preference] = []
    while len(out) < n:
        digits, a, b = sample_pair(task, rng, held_out)
        qa, qb = oracle_quality(digits, a), oracle_quality(digits, b)
        if qa != qb:
            chosen, rejected = (a, b) if qa > qb else (b, a)
            out.append(Preference(task.prompt_text(digits), chosen, rejected, key=f"{name}:{len(out)}"))
    return out
