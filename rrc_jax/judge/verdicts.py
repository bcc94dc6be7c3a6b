"""Parsing judge outputs: pairwise verdicts (`[[A]]` / `[[B]]`) and pointwise scores (`<score>x</score>`).

Rules (the final answer decides; nothing here raises):

`parse_verdict(text)`:
1. If the text has an `<answer>` tag, the final answer is the content of the last one (up to `</answer>`, or to
   the end of the text when the closing tag is missing). It must hold exactly one kind of verdict: `[[A]]` or
   `[[B]]` (case and inner spaces ignored, `[[ b ]]` counts), or be the bare letter `A` / `B`. Anything else,
   including both verdicts or a verdict for another option such as `[[C]]`, is None.
2. Otherwise the final answer is the last line that contains a bracketed verdict `[[X]]` (X one letter). That line
   must hold verdicts of one kind only, A or B. Text after that line (a closing remark) does not matter.
3. No verdict anywhere (truncated reasoning, missing tags, empty output) is None.

`parse_score(text)`: the first number inside the last `<score>` block (closing tag optional); without a tag, a
text that is only a number (IRPO's critique-to-score prompt) or the last `score: x` phrase. Non-finite numbers
and anything else are None. Values are returned as written (IRPO's "-1 = invalid critique" stays -1.0).
"""

from __future__ import annotations

import math
import re

_ANSWER_OPEN = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"<\s*/\s*answer\s*>", re.IGNORECASE)
_BRACKETED = re.compile(r"\[\[\s*([A-Za-z])\s*\]\]")
_SCORE_OPEN = re.compile(r"<\s*score\s*>", re.IGNORECASE)
_SCORE_CLOSE = re.compile(r"<\s*/\s*score\s*>", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_SCORE_PHRASE = re.compile(r"score\s*[:=]\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+))", re.IGNORECASE)


def _one_kind(letters: list[str]) -> str | None:
    kinds = {x.upper() for x in letters}
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    return kind if kind in ("A", "B") else None


def _last_block(text: str, open_re: re.Pattern, close_re: re.Pattern) -> str | None:
    opens = list(open_re.finditer(text))
    if not opens:
        return None
    rest = text[opens[-1].end():]
    close = close_re.search(rest)
    return rest[:close.start()] if close else rest


def parse_verdict(text) -> str | None:
    """'A', 'B' or None (abstain) for a pairwise judge output; see the module docstring for the rules."""
    if not isinstance(text, str) or not text:
        return None
    answer = _last_block(text, _ANSWER_OPEN, _ANSWER_CLOSE)
    if answer is not None:
        letters = _BRACKETED.findall(answer)
        if letters:
            return _one_kind(letters)
        bare = answer.strip().upper()
        return bare if bare in ("A", "B") else None
    for line in reversed(text.splitlines()):
        letters = _BRACKETED.findall(line)
        if letters:
            return _one_kind(letters)
    return None


def _finite(s: str) -> float | None:
    try:
        x = float(s)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def parse_score(text) -> float | None:
    """The pointwise score of a judge output (float) or None; see the module docstring for the rules."""
    if not isinstance(text, str) or not text:
        return None
    block = _last_block(text, _SCORE_OPEN, _SCORE_CLOSE)
    if block is not None:
        m = _NUMBER.search(block)
        return _finite(m.group()) if m else None
    stripped = text.strip()
    if _NUMBER.fullmatch(stripped):
        return _finite(stripped)
    phrases = _SCORE_PHRASE.findall(text)
    return _finite(phrases[-1]) if phrases else None
