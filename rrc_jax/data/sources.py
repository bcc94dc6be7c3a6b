"""Where rows come from: a local file, a saved dataset or a Hugging Face Hub dataset, read with `datasets`.

`read_rows(path, split)` is the one reader of the prompt files (`rrc_jax.data.prompts`) and the preference files
(`rrc_jax.data.preferences`). `path` is

- a local `.jsonl` / `.json` (a JSON list or JSON lines), `.csv` or `.parquet` file, each optionally `.gz`
  compressed (not parquet);
- a folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk` (then its `split`);
- otherwise a Hub name `org/name`, read as `load_dataset(name, split=split)` (needs the network, or the
  `datasets` cache).

Types are those `datasets` infers for the whole file. `render_conversation` is how a chat conversation reads as
one text (what a judge is shown of a multi-turn prompt).
"""

from __future__ import annotations

import re
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


def read_rows(path: str, split: str = "train"):
    """(the rows of `path` as a `datasets.Dataset`, a name for them in messages: the file or folder name, with
    `[split]` when the source has splits). A `ConfigError` naming `path` when it cannot be read."""
    import datasets
    import pyarrow as pa

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
        try:
            return datasets.load_dataset(kind, data_files=str(p), split="train"), p.name
        except (datasets.exceptions.DatasetGenerationError, pa.ArrowException, StopIteration) as e:
            cause = e.__cause__ or e
            why = "no rows" if isinstance(cause, StopIteration) else f"{type(cause).__name__}: {cause}"
            raise ConfigError(f"{path}: not readable as {kind} ({why})") from e
    if not looks_like_hub_name(path):
        raise ConfigError(f"{path} does not exist; {WHERE}")
    try:
        return datasets.load_dataset(path, split=split), f"{path}[{split}]"
    except (datasets.exceptions.DatasetNotFoundError, ConnectionError, FileNotFoundError, ValueError) as e:
        raise ConfigError(f"{path} is not a local file or folder, and the Hugging Face Hub did not provide it "
                          f"(split {split!r}): {e}") from e


def render_conversation(turns: list[tuple[str, str]]) -> str:
    """A conversation `[(role, content)]` as one text: a single turn is its content; several are
    `"{Role}: {content}"` each, separated by blank lines."""
    if len(turns) == 1:
        return turns[0][1]
    return "\n\n".join(f"{role.capitalize()}: {content}" for role, content in turns)
