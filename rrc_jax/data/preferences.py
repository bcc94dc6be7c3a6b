"""Preference data: the records every reward-model recipe and the evaluator read, and the loaders of the benchmarks'
files.

A `Preference` is one judged pair: `chosen` is better than `rejected` for `prompt`. `load_preferences(path, format)`
reads a file (or a saved dataset, or a hub dataset) with `datasets` and returns a `PreferenceSet`: the records, the
source, and `counts` of what happened to every row.

Sources (`path`): a local file (jsonl / json / csv, optionally gzipped, or parquet), a `save_to_disk` folder or a
Hugging Face Hub name, read by `rrc_jax.data.sources.read_rows` (a `DatasetDict`'s or a hub dataset's `split`).
Types are those `datasets` infers for the whole file (a column mixing strings and lists reads as JSON values, row by
row).

Formats (the fields each reads; others are ignored; "text" is a non-empty str):

- `helpsteer3` (HelpSteer3, `preference` config), one row -> 0 or 1 Preference:
  `context`: str, or list of `{role: str, content: str}` ending with a user message; `response1`, `response2`: text;
  `overall_preference`: int in -3..3 (negative: response1 is better; 0: about the same); `individual_preference`:
  optional list (0-3 annotators) of `{score: int in -3..3, reasoning: str}` (`feedback1` / `feedback2` ignored);
  `domain`: optional str.
  chosen / rejected: response1 / response2 when overall_preference < 0, the other way when > 0.
  prompt: a str context as is; a single user message, its content; a conversation, every turn (system included)
  as `"{Role}: {content}"`, separated by blank lines, the last user turn last.
  rationale: the reasoning of the annotators whose own score has the sign of overall_preference, joined by a blank
  line ("" when none, or no individual_preference). strength: |overall_preference| (1..3).
  Dropped: overall_preference 0 (`ties_dropped`); strength < min_strength (`weak_dropped`; IRPO uses 2).
- `rmbench` (RM-Bench `total_dataset.json`), one row -> 9 Preferences:
  `id` (ignored), `prompt`: text; `chosen`, `rejected`: lists of 3 texts (concise, detailed, detailed markdown);
  `domain`: optional str (chat, code, math, safety-refuse, safety-response).
  chosen[i] vs rejected[j] for i, j in 0..2, row-major, `style=(i, j)`, all with the row's key; strength 0.
  Hard = the upper triangle (i < j), normal = the diagonal, easy = the lower triangle.
- `judgebench` (JudgeBench jsonl), one row -> 0 or 1 Preference:
  `question`: text (the prompt); `response_A`, `response_B`: text; `label`: str, "A>B" (chosen A) or "B>A" (chosen
  B); `source`: optional str (the domain); `pair_id`, `original_id`, `response_model` ignored. Any other label
  (e.g. "A=B") is dropped (`labels_dropped`). The file's A/B order is not kept: the key `FILE:ROW` finds the row,
  and the evaluator shows both orders anyway. strength 0.
- `pairs` (generic), one row -> 0 or 1 Preference: `prompt`, `chosen`, `rejected`: text; `rationale`: optional
  str; `strength`: optional int >= 0 (0 when absent); `domain`: optional str. Dropped: strength < min_strength
  (`weak_dropped`).

Every Preference's key is `"{name}:{row}"`: the file or folder name (`hs3.jsonl`), with `[split]` for a source that
has splits (a saved DatasetDict, a hub dataset: `nvidia/HelpSteer3[validation]`), and the 0-based row in it.

Rows are read in order (at most `limit`). A malformed row (a field missing or null, of the wrong type, an empty
text, a number out of range, an RM-Bench list not of 3) is a `ConfigError` naming the file, the 0-based row and the
field, unless `skip_bad_rows=True`, which skips it and counts it in `bad_rows_skipped`. Nothing is dropped without a
count: `counts` always has every key of `COUNTS`, and rows = (rows that made pairs) + ties_dropped + weak_dropped +
bad_rows_skipped + labels_dropped; pairs = len(prefs) (9 per RM-Bench row, 1 per other row).
"""

from __future__ import annotations

import dataclasses

from rrc_jax.data.sources import read_rows
from rrc_jax.errors import ConfigError
from rrc_jax.models.hf_io import render_conversation


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


FORMATS = ("helpsteer3", "rmbench", "judgebench", "pairs")
COUNTS = ("rows", "pairs", "ties_dropped", "weak_dropped", "bad_rows_skipped", "labels_dropped")
RMBENCH_STYLES = ("concise", "detailed", "detailed markdown")  # the index of each in `Preference.style`
JUDGEBENCH_LABELS = ("A>B", "B>A")

# A row function's result: the row's preferences, or the name of the counter its (deliberate) drop goes to.
RowResult = list[Preference] | str


@dataclasses.dataclass
class PreferenceSet:
    """Loaded preferences and what happened to every row.

    prefs: the `Preference` records, in file order (an RM-Bench row's 9 together, `style` row-major).
    source: the path or hub name as given.
    counts: every key of `COUNTS`, 0 when nothing happened (module docstring): `rows` read; `pairs` made;
      `ties_dropped`, `weak_dropped`, `bad_rows_skipped`, `labels_dropped` rows.
    """

    prefs: list[Preference]
    source: str
    counts: dict[str, int]


class BadRow(Exception):
    """A malformed row: which `field` and what is wrong with it (`problem`, worded to follow "field 'x' ")."""

    def __init__(self, field: str, problem: str):
        super().__init__(field, problem)
        self.field, self.problem = field, problem


def _bad_row_message(source: str, index: int, bad: BadRow) -> str:
    """The one wording of a malformed-row error (file, 0-based row, field, the fix)."""
    return (f"{source} row {index}: field {bad.field!r} {bad.problem}; fix the row, or set "
            f"data.skip_bad_rows=True to skip such rows (they are counted in bad_rows_skipped)")


# --- field readers: a value of the right type or `BadRow` --------------------------------------------------------


def _text(value, field: str, *, optional: bool = False) -> str:
    """A non-empty string; with `optional`, missing / None / "" is ""."""
    if value is None:
        if optional:
            return ""
        raise BadRow(field, "is missing")
    if not isinstance(value, str):
        raise BadRow(field, f"must be a string, got {type(value).__name__} {value!r:.40}")
    if not value.strip() and not optional:
        raise BadRow(field, "is empty")
    return value


def _int(value, field: str, lo: int, hi: int | None = None, *, optional: bool = False) -> int:
    """An integer in lo..hi (an integral float counts: a column with one float reads every number as float)."""
    if value is None and optional:
        return 0
    if value is None:
        raise BadRow(field, "is missing")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        raise BadRow(field, f"must be an integer {span}, got {value!r:.40}")
    return value


def _texts(value, field: str, n: int, what: str) -> list[str]:
    """A list of exactly `n` non-empty strings (`what` names them in the error)."""
    if value is None:
        raise BadRow(field, "is missing")
    if not isinstance(value, list) or len(value) != n:
        got = f"{len(value)} items" if isinstance(value, list) else type(value).__name__
        raise BadRow(field, f"must be a list of {n} {what}, got {got}")
    return [_text(v, f"{field}[{i}]") for i, v in enumerate(value)]


def context_text(context) -> str:
    """HelpSteer3's prompt text: a plain string as is; one user message, its content; a conversation, every turn as
    `"{Role}: {content}"`, blank-line separated, ending with the last (user) turn."""
    if context is None or isinstance(context, str):
        return _text(context, "context")
    if not isinstance(context, list) or not context:
        raise BadRow("context", "must be a string or a non-empty list of {role, content} messages")
    turns = []
    for k, m in enumerate(context):
        if not isinstance(m, dict):
            raise BadRow(f"context[{k}]", f"must be a {{role, content}} message, got {type(m).__name__}")
        turns.append((_text(m.get("role"), f"context[{k}].role"),
                      _text(m.get("content"), f"context[{k}].content", optional=True)))
    if turns[-1][0] != "user":
        raise BadRow("context", f"must end with a user message (the responses answer it), ends with "
                                 f"{turns[-1][0]!r}")
    _text(turns[-1][1], f"context[{len(turns) - 1}].content")
    return render_conversation(turns)


def _annotator_rationale(annotators, overall: int) -> str:
    """The reasoning of the annotators whose own score has the sign of `overall`, blank-line joined ("" if none)."""
    if annotators is None:
        return ""
    if not isinstance(annotators, list):
        raise BadRow("individual_preference", f"must be a list of {{score, reasoning}}, got "
                                               f"{type(annotators).__name__}")
    texts = []
    for k, a in enumerate(annotators):
        if not isinstance(a, dict):
            raise BadRow(f"individual_preference[{k}]", f"must be a {{score, reasoning}}, got {type(a).__name__}")
        score = _int(a.get("score"), f"individual_preference[{k}].score", -3, 3)
        reasoning = _text(a.get("reasoning"), f"individual_preference[{k}].reasoning", optional=True).strip()
        if reasoning and (score > 0) - (score < 0) == (overall > 0) - (overall < 0):
            texts.append(reasoning)
    return "\n\n".join(texts)


# --- one function per format: a row (dict) -> its preferences, or the counter of its drop -------------------------


def _helpsteer3_row(row: dict, key: str) -> RowResult:
    prompt = context_text(row.get("context"))
    r1, r2 = _text(row.get("response1"), "response1"), _text(row.get("response2"), "response2")
    overall = _int(row.get("overall_preference"), "overall_preference", -3, 3)
    rationale = _annotator_rationale(row.get("individual_preference"), overall)
    domain = _text(row.get("domain"), "domain", optional=True)
    if overall == 0:
        return "ties_dropped"
    chosen, rejected = (r1, r2) if overall < 0 else (r2, r1)
    return [Preference(prompt, chosen, rejected, rationale=rationale, strength=abs(overall), key=key,
                       domain=domain)]


def _rmbench_row(row: dict, key: str) -> RowResult:
    prompt = _text(row.get("prompt"), "prompt")
    what = f"responses ({', '.join(RMBENCH_STYLES)})"
    chosen = _texts(row.get("chosen"), "chosen", 3, what)
    rejected = _texts(row.get("rejected"), "rejected", 3, what)
    domain = _text(row.get("domain"), "domain", optional=True)
    return [Preference(prompt, c, r, key=key, domain=domain, style=(i, j))
            for i, c in enumerate(chosen) for j, r in enumerate(rejected)]


def _judgebench_row(row: dict, key: str) -> RowResult:
    question = _text(row.get("question"), "question")
    a, b = _text(row.get("response_A"), "response_A"), _text(row.get("response_B"), "response_B")
    label = _text(row.get("label"), "label")
    domain = _text(row.get("source"), "source", optional=True)
    if label not in JUDGEBENCH_LABELS:
        return "labels_dropped"
    chosen, rejected = (a, b) if label == "A>B" else (b, a)
    return [Preference(question, chosen, rejected, key=key, domain=domain)]


def _pairs_row(row: dict, key: str) -> RowResult:
    return [Preference(_text(row.get("prompt"), "prompt"), _text(row.get("chosen"), "chosen"),
                       _text(row.get("rejected"), "rejected"),
                       rationale=_text(row.get("rationale"), "rationale", optional=True),
                       strength=_int(row.get("strength"), "strength", 0, optional=True), key=key,
                       domain=_text(row.get("domain"), "domain", optional=True))]


_ROW_FNS = {"helpsteer3": _helpsteer3_row, "rmbench": _rmbench_row, "judgebench": _judgebench_row,
            "pairs": _pairs_row}
_STRENGTHLESS = ("rmbench", "judgebench")  # formats whose preferences all have strength 0


def load_preferences(path: str, format: str, *, split: str = "train", skip_bad_rows: bool = False,
                     min_strength: int = 0, limit: int | None = None) -> PreferenceSet:
    """The preferences of `path` in `format` (one of `FORMATS`; module docstring), with what happened to each row.

    split: the split of a hub dataset or of a saved DatasetDict (a single file or saved Dataset has one).
    skip_bad_rows: skip malformed rows (counted in `bad_rows_skipped`) instead of raising `ConfigError`.
    min_strength: drop preferences whose strength is below it (counted in `weak_dropped`; IRPO: 2). HelpSteer3
      and pairs only: RM-Bench and JudgeBench carry no strength.
    limit: read at most this many rows (None: all).
    """
    if format not in FORMATS:
        raise ConfigError(f"unknown preference format {format!r}; the formats are {', '.join(FORMATS)}")
    if isinstance(min_strength, bool) or not isinstance(min_strength, int) or min_strength < 0:
        raise ConfigError(f"min_strength must be an integer >= 0, got {min_strength!r}")
    if min_strength and format in _STRENGTHLESS:
        raise ConfigError(f"min_strength={min_strength} with format {format!r}: its preferences carry no strength "
                          f"(all 0), so every one would be dropped; set min_strength=0")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"limit must be None or an integer >= 0, got {limit!r}")
    bad_lines: list | None = [] if skip_bad_rows else None  # malformed JSON lines, skipped (file:line)
    ds, prefix = read_rows(path, split, bad_lines=bad_lines)
    row_fn = _ROW_FNS[format]
    counts = dict.fromkeys(COUNTS, 0)
    counts["bad_rows_skipped"] += len(bad_lines or [])
    prefs: list[Preference] = []
    for index, row in enumerate(ds):
        if limit is not None and index >= limit:
            break
        counts["rows"] += 1
        try:
            made = row_fn(row, f"{prefix}:{index}")
        except BadRow as bad:
            if not skip_bad_rows:
                raise ConfigError(_bad_row_message(path, index, bad)) from None
            counts["bad_rows_skipped"] += 1
            continue
        if isinstance(made, str):
            counts[made] += 1
        elif made[0].strength < min_strength:
            counts["weak_dropped"] += 1
        else:
            prefs.extend(made)
            counts["pairs"] += len(made)
    return PreferenceSet(prefs, path, counts)
