"""The packaged chat prompt set (`data.path="chat"`): 96 short questions this project wrote itself, each with a
short answer that can be checked in a response, for runs and reports on the real model (`models.*="real"`).

`prompts.jsonl` holds one row per question: `id` (its category and number: `arith-01`, `units-01`, `capital-01`,
`spell-01`, `order-01`, `fact-01`), `prompt` (a question ending "Answer briefly.") and `answer` (the short correct
answer: a number, a word, or a list such as "2, 4, 7, 9"). The categories alternate row by row, so that the held-out
tail of the file (`rrc_jax.data.prompts.chat_prompts`) has some of each; no answer appears in its own prompt.

`contains_answer(response, answer)` is the check: the answer, normalized (`normalize`), occurs in the normalized
response as a whole token (not inside a longer word or number). It reads "six" as 6 and "5,000" as 5000; it does
not judge anything else of the response, its length included.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

PATH = Path(__file__).with_name("prompts.jsonl")
FIELDS = ("id", "prompt", "answer")

_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
          "seventeen eighteen nineteen").split()
_TENS = {w: 10 * k for k, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
NUMBER_WORDS = {**{w: k for k, w in enumerate(_UNITS)}, **_TENS}  # word -> value (0..19 and the tens to 90)
_COMPOUND = re.compile(rf"\b({'|'.join(_TENS)})[- ]({'|'.join(_UNITS[1:10])})\b")
_WORD = re.compile(rf"\b({'|'.join(NUMBER_WORDS)})\b")


def normalize(text: str) -> str:
    """`text` lower-cased, thousands separators dropped ("5,000" -> "5000"), number words as digits up to 99
    ("twenty-four" -> "24"), list commas as ", " and runs of white space as one space."""
    t = text.lower()
    t = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", t)
    t = _COMPOUND.sub(lambda m: str(_TENS[m[1]] + NUMBER_WORDS[m[2]]), t)
    t = _WORD.sub(lambda m: str(NUMBER_WORDS[m[1]]), t)
    t = re.sub(r"\s*,\s*", ", ", t)
    return re.sub(r"\s+", " ", t).strip()


def contains_answer(response: str, answer: str) -> bool:
    """Whether `response` holds `answer` (both `normalize`d) as a whole token: not inside a longer word or number
    ("4" is not in "14" nor in "4.5"), case-insensitive."""
    a = re.escape(normalize(answer))
    return re.search(rf"(?<![a-z0-9])(?<!\d\.){a}(?![a-z0-9]|\.\d)", normalize(response)) is not None


@cache
def chat_rows() -> tuple[dict, ...]:
    """The set's rows (`FIELDS`), in file order; a ValueError naming the line of a malformed one."""
    rows = []
    for line_no, line in enumerate(PATH.read_text().splitlines(), 1):
        row = json.loads(line)
        if sorted(row) != sorted(FIELDS) or not all(isinstance(row[f], str) and row[f] for f in FIELDS):
            raise ValueError(f"{PATH}:{line_no}: a row needs non-empty string fields {', '.join(FIELDS)}")
        rows.append(row)
    return tuple(rows)


def answers() -> list[str]:
    """The answer of each row `[96]`, in file order."""
    return [r["answer"] for r in chat_rows()]
