"""AGR anchors (Algorithm 2): n responses per training prompt from the fixed reference policy, generated once and
stored on disk with their prompt ids.

    python -m rrc_jax.anchors --config=configs/agr.py [--config.reward.n_anchors=8]

File format: JSON lines `{"id": <prompt id>, "prompt": <text>, "anchors": [<text>, ...]}`, one per training prompt.
The trainer loads the file named by `reward.anchors_path` (default `workdir/anchors.jsonl`) and generates it when it
is missing. With `reward.anchor_refresh_every = k > 0` the trainer regenerates them every k steps from a snapshot
of the current policy (the review's suggestion 9(c)3; off by default, as in the paper).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rrc_jax.models import Decoder, prompt_ids
from rrc_jax.progress import Progress
from rrc_jax.sampling import generate


def decode_responses(tokenizer, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
    """Texts of sampled responses `[R, N]` (special tokens, e.g. EOS, removed)."""
    return [tokenizer.decode(t[:n].tolist(), skip_special_tokens=True) for t, n in zip(tokens, lengths)]


def generate_anchors(model: Decoder, tokenizer, prompts: Sequence[str], n: int, *, max_new_tokens: int,
                     temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, batch_size: int = 256
                     ) -> list[list[str]]:
    """`n` sampled responses of `model` for each prompt: `[len(prompts)][n]` texts."""
    if n < 1:
        raise ValueError(f"n_anchors={n} must be >= 1")
    ids = [prompt_ids(tokenizer, p) for p in prompts]
    rows = [i for i in range(len(prompts)) for _ in range(n)]
    out: list[str] = []
    with Progress(len(rows), "anchors") as bar:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            res = generate(model, [ids[i] for i in chunk], max_new_tokens=max_new_tokens, rng=seed + start,
                           temperature=temperature, top_p=top_p)
            out.extend(decode_responses(tokenizer, res.tokens, res.lengths))
            bar.update(len(chunk))
    return [out[i * n:(i + 1) * n] for i in range(len(prompts))]


def save_anchors(path: str | os.PathLike, ids: Sequence[int], prompts: Sequence[str],
                 anchors: Sequence[Sequence[str]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        for i, p, a in zip(ids, prompts, anchors):
            f.write(json.dumps({"id": int(i), "prompt": p, "anchors": list(a)}) + "\n")
    tmp.replace(path)


def load_anchors(path: str | os.PathLike, ids: Sequence[int], prompts: Sequence[str], n: int) -> list[list[str]]:
    """Anchors `[len(ids)][n]` for the given prompt ids; one-line errors for a missing prompt, a changed prompt
    text or too few anchors."""
    table = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            table[int(row["id"])] = row
    out = []
    for i, p in zip(ids, prompts):
        row = table.get(int(i))
        if row is None:
            raise ValueError(f"{path}: no anchors for prompt id {i}; delete the file to regenerate it")
        if row["prompt"] != p:
            raise ValueError(f"{path}: prompt id {i} holds a different prompt than the dataset's; delete the file to "
                             "regenerate it")
        if len(row["anchors"]) < n:
            raise ValueError(f"{path}: prompt id {i} has {len(row['anchors'])} anchors, n_anchors={n} wanted; "
                             "delete the file to regenerate it or lower reward.n_anchors")
        out.append(row["anchors"][:n])
    return out


def main(argv):  # the CLI: python -m rrc_jax.anchors --config=...
    del argv
    from rrc_jax import train

    setup = train.build(train.CONFIG.value, need_judge=False)
    train.ensure_anchors(setup, force=True)


if __name__ == "__main__":
    from absl import app

    from rrc_jax import train  # noqa: F401  (defines --config)

    app.run(main)
