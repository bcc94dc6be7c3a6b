"""AGR anchors (Algorithm 2): n responses per training prompt from the fixed reference policy, generated once and
stored on disk with their prompt ids.

File format: JSON lines `{"id": <prompt id>, "prompt": <text>, "anchors": [<text>, ...]}`, one per training prompt.
`AnchorStore.generate` (re)writes it from a sampler (the reference policy, or the current policy when AGR refreshes
its anchors, the review's suggestion 9(c)3) and `load` reads it.
"""

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


def load_anchors(path: str | os.PathLike, ids: Sequence[int], prompts: Sequence[str], n: int) -> list[list[str]]:
    """Anchors `[len(ids)][n]` for the given prompt ids; a one-line `ConfigError` for a missing prompt, a changed
    prompt text or too few anchors."""
    table = {}
    with epath.Path(path).open() as f:
        for line in f:
            row = json.loads(line)
            table[int(row["id"])] = row
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

    def load(self) -> None:
        """Read the file (`load_anchors`)."""
        self.anchors = load_anchors(self.path, self.prompts.ids, self.prompts.texts, self.n)

    def generate(self, sampler: Sampler, seed: int = 0) -> None:
        """(Re)generate every prompt's anchors with `sampler` (each host its `distributed.host_block` of the
        prompts; every host then holds them all) and write the file."""
        own = distributed.host_block(len(self.prompts.texts))
        mine = generate_anchors(sampler, self.tokenizer,
                                [prompt_tokens(self.tokenizer, self.prompts, self.prompts.texts[i]) for i in own],
                                self.n, self.params, seed)
        flat = distributed.gather_texts([a for group in mine for a in group])
        texts = [flat[i * self.n:(i + 1) * self.n] for i in range(len(self.prompts.texts))]
        save_anchors(self.path, self.prompts.ids, self.prompts.texts, texts)
        distributed.barrier("anchors written")  # other hosts may read the file next
        self.anchors = texts
        say(f"wrote {len(texts)} x {self.n} anchors to {self.path}")

    def __getitem__(self, prompt_index: np.ndarray) -> list[list[str]]:
        """The anchors `[B][n]` of prompts `prompt_index [B]` (indices into the prompt set)."""
        if self.anchors is None:
            raise RuntimeError("AnchorStore.load() must run before anchors are read")
        return [self.anchors[int(i)] for i in prompt_index]
