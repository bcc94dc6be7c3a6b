"""Reward-model training examples from preference pairs: judge questions with their target judgments (GRM SFT,
Eq. 2) and chosen / rejected rows (DRM, Eq. 1), as endless batch iterators.

A GRM example is a judge question rendered with a judging template (`rrc_jax.judge.templates`) exactly as the judge
renders it at inference, followed by the target judgment (rationale, then `[[A]]` / `[[B]]`). The A/B order of
every pair is drawn at random, so the verdict letter carries no position prior. A DRM example is a
(prompt + chosen, prompt + rejected) pair scored by the value head at its last token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from rrc_jax.models.batches import completion_batch, length_bucket, pad_sequences
from rrc_jax.data.preferences import Preference
from rrc_jax.judge.templates import JudgeTemplate, encode_text, get_template, render_parts
from rrc_jax.models import prompt_ids


def grm_example(tokenizer, template: str | JudgeTemplate, pref: Preference, rng: np.random.Generator,
                judgment: Callable[[str, str, bool], str] | None = None) -> tuple[list[int], list[int]]:
    """(question ids, judgment ids + EOS) for one preference with a random A/B order.

    `judgment(a, b, a_is_chosen)` writes the target text; by default `' {rationale} [[A|B]]'` (a direct-verdict
    template, one that does not think: `[[A|B]]` alone).
    """
    template = get_template(template)
    chosen_first = bool(rng.random() < 0.5)
    a, b = (pref.chosen, pref.rejected) if chosen_first else (pref.rejected, pref.chosen)
    prefix, suffix = render_parts(tokenizer, template, pref.prompt, a=a, b=b)
    if judgment is None:
        verdict = "A" if chosen_first else "B"
        target = f" {pref.rationale} [[{verdict}]]" if pref.rationale and template.think else f" [[{verdict}]]"
    else:
        target = judgment(a, b, chosen_first)
    completion = encode_text(tokenizer, target, first=False) + [int(tokenizer.eos_token_id)]
    return encode_text(tokenizer, prefix + suffix, first=True), completion


def scored_ids(tokenizer, prompt: str, response: str) -> list[int]:
    """The ids a reward model scores for `response` to `prompt`: with a chat template, the conversation
    `[user: prompt, assistant: response]` as the template renders it; without one, `prompt_ids(prompt)` followed by
    the response and EOS. The value head reads the last token."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        return list(tokenizer(tokenizer.apply_chat_template(messages, tokenize=False),
                              add_special_tokens=False)["input_ids"])
    return prompt_ids(tokenizer, prompt) + encode_text(tokenizer, response, first=False) + [int(tokenizer.eos_token_id)]


def sft_batches(examples: Callable[[], tuple[list[int], list[int]]], batch_size: int, pad_id: int
                ) -> Iterator[dict[str, np.ndarray]]:
    """Endless SFT batches (`completion_batch`) from an example factory `() -> (prompt ids, completion ids)`."""
    while True:
        ex = [examples() for _ in range(batch_size)]
        yield completion_batch([p for p, _ in ex], [c for _, c in ex], pad_id)


def drm_batches(tokenizer, prefs: Callable[[], Preference], batch_size: int, pad_id: int, margin: bool = False
                ) -> Iterator[dict[str, np.ndarray]]:
    """Endless Bradley-Terry batches: prompt + chosen vs prompt + rejected (`scored_ids`); with `margin`, each
    pair's preference strength as `margin [B]` (Eq. 1 with a margin)."""
    while True:
        ps = [prefs() for _ in range(batch_size)]
        rows = {side: [scored_ids(tokenizer, p.prompt, getattr(p, side)) for p in ps] for side in ("chosen", "rejected")}
        length = length_bucket(max(len(r) for side in rows.values() for r in side))
        batch = {}
        for side, seqs in rows.items():
            batch[f"{side}_ids"], batch[f"{side}_mask"] = pad_sequences(seqs, length, pad_id, "right")
        if margin:
            batch["margin"] = np.asarray([p.strength for p in ps], np.float32)
        yield batch
