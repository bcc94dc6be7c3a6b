"""Test doubles that ship with the package, for this project's tests and for a user's tests of their own rewards.

`TextSampler` is the Sampler protocol (`rrc_jax.inference.sampler`) answered from text instead of a model: every
question (its prefix and suffix ids, decoded) gets `answer(text)` as its continuation, and `logprobs(text,
token_ids)` as its next-token log-probabilities, so a judge, a reward or an evaluator can be tested against a judge
whose every verdict is known.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rrc_jax.inference.sampler import SampleOutput, SamplerStats, SamplingParams


class TextSampler:
    """The Sampler protocol over text (module docstring).

    Args:
      tokenizer: decodes the questions and encodes the answers (`skip_special_tokens` / no special tokens).
      answer: `answer(text) -> str`, the continuation of a question (of a prompt, for `generate`).
      logprobs: `logprobs(text, token_ids) -> [len(token_ids)]` log-probabilities of the next token after a
        question; default `log 0.75`, `log 0.25` for the first two ids (P(A) = 0.75).
      eos_id: the id written after each answer (default the tokenizer's EOS).
      context_length: what `context_length` reports (None: questions are not checked against it).
      role: what `role` reports (`grm`: it usually stands in for a judge).

    An answer longer than `max_new_tokens` with its EOS is cut there and marked truncated. Every question is kept in
    `questions`; `stats.calls` counts `generate` and `complete` calls, `stats.generated_tokens` their tokens.
    """

    def __init__(self, tokenizer, answer: Callable[[str], str] = lambda text: "[[A]]",
                 logprobs: Callable[[str, Sequence[int]], Sequence[float]] | None = None, *,
                 eos_id: int | None = None, context_length: int | None = None, role: str = "grm"):
        self.tokenizer, self.answer, self.logprobs, self.role = tokenizer, answer, logprobs, role
        self.eos_id = int(tokenizer.eos_token_id if eos_id is None else eos_id)
        self.pad_id, self.stop_token_ids, self.context_length = 0, (self.eos_id,), context_length
        self.questions: list[str] = []
        self.stats = SamplerStats()

    def text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _out(self, texts: Sequence[str], n: int) -> SampleOutput:
        rows = [self.tokenizer(self.answer(t), add_special_tokens=False)["input_ids"] + [self.eos_id] for t in texts]
        tokens = np.full((len(rows), n), self.pad_id, np.int32)
        lengths = np.array([min(len(r), n) for r in rows], np.int32)
        for i, r in enumerate(rows):
            tokens[i, :lengths[i]] = r[:lengths[i]]
        self.stats.calls += 1
        self.stats.generated_tokens += int(lengths.sum())
        truncated = np.array([len(r) > n for r in rows], bool)
        return SampleOutput(tokens, np.zeros(tokens.shape, np.float32), lengths, truncated)

    def generate(self, prompt_ids, group_size: int = 1, params: SamplingParams = SamplingParams(), rng=0):
        return self._out([self.text(p) for p in prompt_ids for _ in range(group_size)], params.max_new_tokens)

    def complete(self, prefixes, suffixes, params: SamplingParams = SamplingParams(), rng=0, *, streams=None,
                 splits=None):
        texts = [self.text(list(prefixes[o]) + list(s)) for o, s in suffixes]
        self.questions += texts
        return self._out(texts, params.max_new_tokens)

    def next_token_logprobs(self, prefixes, suffixes, token_ids, *, splits=None):
        texts = [self.text(list(prefixes[o]) + list(s)) for o, s in suffixes]
        self.questions += texts
        if self.logprobs is None:
            return np.tile(np.log([0.75, 0.25])[:len(token_ids)], (len(texts), 1)).astype(np.float32)
        return np.array([self.logprobs(t, token_ids) for t in texts], np.float32).reshape(len(texts), len(token_ids))

    def update_weights(self, params) -> None:
        """Nothing to update: the answers are the model."""
