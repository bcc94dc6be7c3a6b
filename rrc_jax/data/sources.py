"""Where rows come from: a local file, a saved dataset or a Hugging Face Hub dataset, read with `datasets`.

`read_rows(path, split)` is the one reader of the prompt files (`rrc_jax.data.prompts`) and the preference files
(`rrc_jax.data.preferences`). `path` is

- a local `.jsonl` / `.json` (a JSON list or JSON lines), `.csv` or `.parquet` file, each optionally `.gz`
  compressed (not parquet);
- a folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk` (then its `split`);
- otherwise a Hub name `org/name`, read as `load_dataset(name, split=split)` (needs the network, or the
  `datasets` cache).

Types are those `datasets` infers for the whole file. A JSON file that `datasets` cannot read (or whose text is
not UTF-8) is scanned for where it is malformed: each line of JSON lines that is not one JSON object in UTF-8
(blank lines are fine) is named as `FILE:LINE`; with a `bad_lines` list they are skipped instead (and listed
there), the file's other rows read as usual. A CSV file's first line that is not UTF-8 is named the same way; a
file of blank lines is an error. `rrc_jax.models.render_conversation` is how a chat conversation reads as one text (what a judge
is shown of a multi-turn prompt).
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
from pathlib import Path

from rrc_jax.errors import ConfigError

WHERE = ("give a .jsonl / .json / .csv (each optionally .gz) or .parquet file, a Dataset.save_to_disk folder or a "
         "Hugging Face Hub dataset name org/name")
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_KINDS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def file_kind(p: Path) -> str | None:
    """The `datasets` builder of a local file ("json" / "csv" / "parquet"), None for an unknown suffix."""
    name = p.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    return next((kind for suffix, kind in _KINDS.items() if name.removesuffix(".gz").endswith(suffix)), None)


def looks_like_hub_name(path: str) -> bool:
    return bool(_HUB_NAME.fullmatch(path)) and file_kind(Path(path)) is None


def _open(p: Path):
    return gzip.open(p, "rb") if p.name.lower().endswith(".gz") else open(p, "rb")


def json_line_errors(p: Path) -> list[tuple[int, str]] | None:
    """(1-based line, what is wrong) of each non-blank line of a JSON-lines file that is not one JSON object, read
    as a stream; None when `p` is a JSON document instead (a `.json` file whose first line is not an object by
    itself)."""
    lines = p.name.lower().removesuffix(".gz").endswith(".jsonl")
    bad: list[tuple[int, str]] = []
    seen = False
    with _open(p) as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                value = json.loads(raw.strip())
                why = None if isinstance(value, dict) else f"a JSON {type(value).__name__}, not an object"
            except json.JSONDecodeError as e:
                why = f"{e.msg} at column {e.colno}"
            except UnicodeDecodeError as e:
                why = f"not UTF-8: {e.reason} at byte {e.start}"
            if why and not seen and not lines:
                return None
            seen = True
            if why:
                bad.append((n, why))
    return bad


def _json_document_error(p: Path) -> tuple[int, str] | None:
    """(1-based line, what is wrong) of a malformed JSON document, None when it parses."""
    with _open(p) as f:
        raw = f.read()
    try:
        json.loads(raw)
    except json.JSONDecodeError as e:
        return e.lineno, f"{e.msg} at column {e.colno}"
    except UnicodeDecodeError as e:
        return raw[:e.start].count(b"\n") + 1, f"not UTF-8: {e.reason} at byte {e.start}"
    return None


def _first_non_utf8_line(p: Path) -> tuple[int, str] | None:
    """(1-based line, what is wrong) of the first line of a text file that is not UTF-8, None when all are."""
    with _open(p) as f:
        for n, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return n, f"not UTF-8: {e.reason} at byte {e.start}"
    return None


def _has_text(p: Path) -> bool:
    """Whether a text file has a line that is not blank (read up to the first such line)."""
    with _open(p) as f:
        return any(raw.strip() for raw in f)


def _good_json_lines(p: Path, bad: list[tuple[int, str]], path: str):
    """The rows of the JSON-lines file `p` without its `bad` lines, read by `datasets` from a temporary copy (held
    in memory); a `ConfigError` naming `path` when no line is left."""
    import datasets  # heavy (pyarrow): only for a hub name or an Arrow source

    skip = {n for n, _ in bad}
    with tempfile.TemporaryDirectory() as tmp:
        good, kept = Path(tmp) / "rows.jsonl", 0
        with _open(p) as f, open(good, "wb") as out:
            for n, raw in enumerate(f, 1):
                if n not in skip and raw.strip():
                    out.write(raw.rstrip(b"\r\n") + b"\n")
                    kept += 1
        if not kept:
            line, why = bad[0]
            raise ConfigError(f"{path}: every line is malformed (line {line}: {why}); fix the file")
        return datasets.load_dataset("json", data_files=str(good), split="train", cache_dir=tmp,
                                     keep_in_memory=True)


def read_rows(path: str, split: str = "train", bad_lines: list[tuple[int, str]] | None = None):
    """(the rows of `path` as a `datasets.Dataset`, a name for them in messages: the file or folder name, with
    `[split]` when the source has splits). A `ConfigError` naming `path` when it cannot be read; one naming
    `path:LINE` for a malformed line of JSON lines (or a malformed JSON document), unless `bad_lines` is a list:
    then such lines are skipped and appended to it as (line, what is wrong)."""
    import datasets  # heavy (pyarrow): only for a hub name or an Arrow source
    import pyarrow as pa  # with datasets

    p = Path(path).expanduser()
    if p.is_dir():
        try:
            ds = datasets.load_from_disk(str(p))
        except FileNotFoundError as e:
            raise ConfigError(f"{path} is a folder but not one written by Dataset.save_to_disk ({e}); {WHERE}") from e
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ConfigError(f"{path} has splits {', '.join(ds)}, not {split!r}; choose one of them")
            return ds[split], f"{p.name}[{split}]"
        return ds, p.name
    if p.is_file():
        kind = file_kind(p)
        if kind is None:
            raise ConfigError(f"{path}: unknown file type; {WHERE}")
        if kind != "parquet" and not _has_text(p):
            raise ConfigError(f"{path}: no rows (the file is empty or only blank lines); give a file with rows")
        errors = (datasets.exceptions.DatasetGenerationError, pa.ArrowException, StopIteration, UnicodeDecodeError)
        try:
            ds = datasets.load_dataset(kind, data_files=str(p), split="train")
            ds.data.table.validate(full=True)  # pyarrow's JSON reader keeps invalid UTF-8; it fails when read
            return ds, p.name
        except errors as e:
            failure = e
        if kind == "json":  # where is it malformed?
            bad = json_line_errors(p)
            if bad is None:
                where = _json_document_error(p)
                if where is not None:
                    raise ConfigError(f"{path}:{where[0]}: malformed JSON ({where[1]}); fix the file (rows are "
                                      "skipped only in JSON lines, one object per line)") from failure
            elif bad and bad_lines is None:
                line, why = bad[0]
                more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
                raise ConfigError(f"{path}:{line}: malformed JSON line ({why}){more}; fix it, or set "
                                  "data.skip_bad_rows=True to skip such lines (they are counted)") from failure
            elif bad:
                bad_lines.extend(bad)
                try:
                    return _good_json_lines(p, bad, path), p.name
                except errors as e:
                    failure = e
        elif kind == "csv" and (where := _first_non_utf8_line(p)) is not None:
            raise ConfigError(f"{path}:{where[0]}: {where[1]}; save the file as UTF-8 (data.skip_bad_rows skips "
                              "lines of JSON lines only)") from failure
        cause = failure.__cause__ or failure
        why = "no rows" if isinstance(cause, StopIteration) else f"{type(cause).__name__}: {cause}"
        raise ConfigError(f"{path}: not readable as {kind} ({why})") from failure
    if not looks_like_hub_name(path):
        raise ConfigError(f"{path} does not exist; {WHERE}")
    try:
        return datasets.load_dataset(path, split=split), f"{path}[{split}]"
    except (datasets.exceptions.DatasetNotFoundError, ConnectionError, FileNotFoundError, ValueError) as e:
        raise ConfigError(f"{path} is not a local file or folder, and the Hugging Face Hub did not provide it "
                          f"(split {split!r}): {e}") from e
