"""AGR anchors (Algorithm 2): n responses per training prompt from the fixed reference policy, generated once and
stored on disk with their prompt ids.

File format: JSON lines `{"id": <prompt id>, "prompt": <text>, "anchors": [<text>, ...]}`, one per training prompt.
`AnchorStore.generate` (re)writes it from a sampler and `load` reads it.

Refreshed anchors (AGR's `refresh_every = k`, beyond the paper: the RRC paper's section 9(c), suggestion 3) are
versioned by the step they serve from: before steps k + 1, 2k + 1, ... the current policy's samples are written to
`refreshed/step_<r>.jsonl` (`refresh_step` says which version step s uses), never over the reference's file. A run
resumed from the checkpoint of step c (or falling back to an older one) reads the version that step c + 1 used, so
it judges against exactly the anchors the uninterrupted run did; `prune_refreshed` deletes the versions no
checkpoint on disk can need. """

from __future__ import annotations

import json
import os
from collections.abc import Sequence
import jax
import numpy as np
from etils import epath

from rrc_jax import distributed
from rrc_jax.data.prompts import PromptSet, prompt_tokens
from rrc_jax.errors import ConfigError
from rrc_jax.inference.sampler import Sampler, SamplingParams, response_texts
from rrc_jax.progress import Progress, say


def generate_anchors(sampler: Sampler, tokenizer, ids: Sequence[list[int]], n: int, params: SamplingParams,
                     seed: int = 0, batch_size: int = 256) -> list[list[str]]:
    """`n` sampled responses of the sampler's model for each prompt (`ids`: its tokens as the policy sees it):
    `[len(ids)][n]` texts. On several hosts each passes its own prompts (`batch_size` rows a call over all hosts)
    and gets its own anchors."""
    if n < 1:
        raise ValueError(f"n_anchors={n} must be >= 1")
    per_call = max(1, batch_size // n // jax.process_count())
    out: list[list[str]] = []
    with Progress(len(ids) * n, "anchors") as bar:
        for start in range(0, int(distributed.host_max(len(ids))), per_call):  # as many calls on every host
            chunk = ids[start:start + per_call]
            texts = response_texts(tokenizer, sampler.generate(chunk, n, params,
                                                               rng=jax.random.fold_in(jax.random.key(seed), start)))
            out.extend(texts[i * n:(i + 1) * n] for i in range(len(chunk)))
            bar.update(len(chunk) * n)
    return out


def save_anchors(path: str | os.PathLike, ids: Sequence[int], prompts: Sequence[str],
                 anchors: Sequence[Sequence[str]]) -> None:
    """Write the anchors file atomically (process 0 writes; others return)."""
    if not distributed.is_main():
        return
    path = epath.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        for i, p, a in zip(ids, prompts, anchors):
            f.write(json.dumps({"id": int(i), "prompt": p, "anchors": list(a)}) + "\n")
    tmp.replace(path)


def refresh_step(step: int, every: int) -> int:
    """The step whose refresh made the anchors that step `step` (1-based) judges against: the largest
    `r = 1 + j * every <= step` with j >= 1, or 0 for the reference's anchors (no refresh yet, or `every` 0)."""
    if every <= 0 or step <= every:
        return 0
    return 1 + (step - 1) // every * every


def refreshed_path(directory: str | os.PathLike, step: int) -> epath.Path:
    """The file of the anchors refreshed before step `step` (module docstring)."""
    return epath.Path(directory) / f"step_{step}.jsonl"


def prune_refreshed(directory: str | os.PathLike, keep: set[int]) -> None:
    """Delete the refreshed anchor files of `directory` whose step is not in `keep` (process 0)."""
    directory = epath.Path(directory)
    if not distributed.is_main() or not directory.exists():
        return
    for path in directory.glob("step_*.jsonl"):
        if path.stem[len("step_"):].isdigit() and int(path.stem[len("step_"):]) not in keep:
            path.unlink()


def load_anchors(path: str | os.PathLike, ids: Sequence[int], prompts: Sequence[str], n: int) -> list[list[str]]:
    """Anchors `[len(ids)][n]` for the given prompt ids; a one-line `ConfigError` for a line that is not an anchors
    row (a truncated file: FILE:LINE), a missing prompt, a changed prompt text or too few anchors."""
    table = {}
    with epath.Path(path).open() as f:
        for number, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                if not isinstance(row["prompt"], str) or not isinstance(row["anchors"], list):
                    raise TypeError("prompt must be a string and anchors a list")
                table[int(row["id"])] = row
            except (ValueError, KeyError, TypeError) as e:
                raise ConfigError(f"{path}:{number}: not an anchors row ({type(e).__name__}: {e}); the file is "
                                  "damaged (truncated?): delete it to regenerate it") from None
    out = []
    for i, p in zip(ids, prompts):
        row = table.get(int(i))
        if row is None:
            raise ConfigError(f"{path}: no anchors for prompt id {i}; delete the file to regenerate it")
        if row["prompt"] != p:
            raise ConfigError(f"{path}: prompt id {i} holds a different prompt than the dataset's; delete the file "
                              "to regenerate it")
        if len(row["anchors"]) < n:
            raise ConfigError(f"{path}: prompt id {i} has {len(row['anchors'])} anchors, n_anchors={n} wanted; "
                              "delete the file to regenerate it or lower reward.agr.n_anchors")
        out.append(row["anchors"][:n])
    return out


class AnchorStore:
    """The anchors of a prompt set, `n` per prompt, kept in `path`.

    Args:
      path: the JSON-lines file.
      prompts: the training `PromptSet` (anchors are looked up by prompt index).
      n: anchors per prompt.
      tokenizer: the policy's tokenizer (prompts are rendered as the policy sees them).
      params: how anchors are sampled (the rollouts' temperature, top-p and budget).
    """

    def __init__(self, path: str | os.PathLike, prompts: PromptSet, n: int, tokenizer, params: SamplingParams):
        self.path = epath.Path(path).expanduser()
        self.prompts, self.n, self.tokenizer, self.params = prompts, n, tokenizer, params
        self.anchors: list[list[str]] | None = None

    def load(self, path: str | os.PathLike | None = None) -> None:
        """Read the file (`load_anchors`; `path`, default the store's)."""
        self.anchors = load_anchors(path or self.path, self.prompts.ids, self.prompts.texts, self.n)

    def generate(self, sampler: Sampler, seed: int = 0, path: str | os.PathLike | None = None) -> None:
        """(Re)generate every prompt's anchors with `sampler` (each host its `distributed.host_block` of the
        prompts; every host then holds them all) and write them to `path` (default the store's file)."""
        path = epath.Path(path or self.path)
        own = distributed.host_block(len(self.prompts.texts))
        mine = generate_anchors(sampler, self.tokenizer,
                                [prompt_tokens(self.tokenizer, self.prompts, self.prompts.texts[i]) for i in own],
                                self.n, self.params, seed)
        flat = distributed.gather_texts([a for group in mine for a in group])
        texts = [flat[i * self.n:(i + 1) * self.n] for i in range(len(self.prompts.texts))]
        save_anchors(path, self.prompts.ids, self.prompts.texts, texts)
        distributed.barrier("anchors written")  # other hosts may read the file next
        self.anchors = texts
        say(f"wrote {len(texts)} x {self.n} anchors to {path}")

    def __getitem__(self, prompt_index: np.ndarray) -> list[list[str]]:
        """The anchors `[B][n]` of prompts `prompt_index [B]` (indices into the prompt set)."""
        if self.anchors is None:
            raise RuntimeError("AnchorStore.load() must run before anchors are read")
        return [self.anchors[int(i)] for i in prompt_index]
