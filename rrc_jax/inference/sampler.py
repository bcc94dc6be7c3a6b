"""The Sampler protocol: everything the trainer and the judge ask of an inference engine, in token ids.

Three calls (Q questions, B prompts, G continuations per prompt, N = `max_new_tokens`):

- `generate(prompt_ids, group_size, params, rng)`: G sampled continuations of each of B prompts (a GRPO group),
  rows `b*G ... b*G + G - 1` for prompt b.
- `complete(prefixes, suffixes, params, rng, streams=, splits=)`: one continuation per question `(prefix index,
  suffix ids)`, i.e. of `prefixes[i] + suffix`. Question q draws from its own stream `streams[q]` of `rng` (default
  q): the same question, key and stream give the same continuation whatever else the call asks. Many questions
  share a prefix (the judge's `[instruction, prompt]`), many suffixes their first `splits[q]` tokens (a judge
  question's first response), and some questions are asked several times (votes); whether and how the engine
  reuses what they share is its own business.
- `next_token_logprobs(prefixes, suffixes, token_ids, splits=)`: log-probabilities `[Q, len(token_ids)]` of the
  listed tokens right after each question (PRC reads P(A) there).

`rrc_jax.inference.engine.JaxSampler` implements it on a `Decoder`; tests implement it with a few lines of
scripted Python. A sampler holds its model: the trainer's policy sampler sees every update as it is applied.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How a continuation is sampled. `temperature=0` is greedy; `top_k=0` and `top_p=1` switch those filters
    off. `stop_token_ids=None` means the sampler's own stop tokens (`rrc_jax.models.stop_tokens`). Hashable:
    static under jit."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] | None = None

    def __post_init__(self):
        if not 0 <= self.temperature < math.inf:  # also NaN
            raise ValueError(f"temperature={self.temperature} must be a finite number >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 = off)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1 = off)")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if self.stop_token_ids is not None:
            object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


class SampleOutput(NamedTuple):
    """tokens `[R, N]` int32 (pad after each row's end), logprobs `[R, N]` (`log_softmax(logits)[token]` of the raw
    distribution; 0 after the end), lengths `[R]` (generated tokens including the stop token), truncated `[R]` (no
    stop token within N)."""

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray


@dataclasses.dataclass
class SamplerStats:
    """What a sampler did since its last `reset()`: calls into the model (`calls`), prompt tokens run through it
    (`prefill_tokens`), prefix tokens it did not run again thanks to prefix reuse (`prefill_tokens_saved`), tokens
    generated (`generated_tokens`) and, for the questions of `complete`, the rows its decode steps advanced
    (`decode_row_steps`: a chunk's rows, padding included, times the steps it ran until its longest judgment
    ended; `decode_row_steps / generated_tokens` is 1.0 when no row-step is wasted)."""

    calls: int = 0
    prefill_tokens: int = 0
    prefill_tokens_saved: int = 0
    generated_tokens: int = 0
    decode_row_steps: int = 0

    def reset(self) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, 0)

    def failures(self) -> dict[str, int]:
        """The requests an engine over a network sent and those it could not answer (abstentions), by kind, for the
        judge's metrics (`openai_engine.HttpStats`); none for an engine in this process."""
        return {}


Suffix = tuple[int, Sequence[int]]  # (index into prefixes, token ids after that prefix)


class Sampler(Protocol):
    """See the module docstring. `rng` is a PRNG key or an int seed; a given key always gives the same result.

    What callers read: `role` (what it samples for: `policy`, `reference`, `grm`, `drm`), `tokenizer` (None when
    built without one), `pad_id` (written after a row's end), `stop_token_ids` (the default stop tokens),
    `context_length` (the most tokens, prompt plus continuation, a row holds; None when unknown) and `stats`.
    `update_weights(params)` is called by the trainer after each optimizer step (and after a resume) with the
    policy's new parameters (an `nnx.State` of `nnx.Param`s): an engine that holds its own copy of the weights syncs
    it there and returns the bytes per device it moved; one that shares the learner's model object sees the update
    already and returns 0."""

    stats: SamplerStats
    role: str
    tokenizer: object
    pad_id: int
    stop_token_ids: tuple[int, ...]
    context_length: int | None

    def update_weights(self, params) -> int: ...

    def generate(self, prompt_ids: Sequence[Sequence[int]], group_size: int = 1,
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0) -> SampleOutput: ...

    def complete(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix],
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0, *,
                 streams: Sequence[int] | None = None, splits: Sequence[int] | None = None) -> SampleOutput: ...

    def next_token_logprobs(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix],
                            token_ids: Sequence[int], *, splits: Sequence[int] | None = None) -> np.ndarray: ...


def response_texts(tokenizer, out: SampleOutput) -> list[str]:
    """Texts of sampled continuations `[R]`, special tokens (EOS) removed."""
    return [tokenizer.decode(t[:n].tolist(), skip_special_tokens=True) for t, n in zip(out.tokens, out.lengths)]
