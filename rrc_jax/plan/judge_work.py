"""The judge's work in a step (docs/planner.md, "The judge"): the questions a call asks, the tokens it prefills and
decodes, and the one chunk shape the engine runs them in, with the engine's prefix tree (each prompt's prefix
once, each response shown first once, each different question once: `rrc_jax.inference.question_tree`) and, for
comparison, without it (every vote a question of its own after its prompt's shared prefix, as the engine asked
before it read questions as a tree)."""

from __future__ import annotations

import functools
import math
import re
from typing import NamedTuple

from rrc_jax.constructions.base import JudgeLoad
from rrc_jax.inference import question_tree
from rrc_jax.judge.templates import first_segment, get_template
from rrc_jax.models.batches import length_bucket
from rrc_jax.rewards.win_counts import pair_outcome, votes_to_decide

CHARS_PER_TOKEN = 4       # judge template text -> tokens (BPE on English); 1 for the toy character tokenizer


CHAT_FORMAT_TOKENS = 32   # special tokens and role headers of a chat template, per judge question


def template_tokens(s) -> tuple[int, int, int]:
    """Estimated tokens of the judge template's fixed text: (instruction + context, chat format included; the
    item's text up to its first response; the rest of the item)."""
    t = get_template(s.judge.template)
    toy = s.models.grm == "toy"
    rate = 1 if toy else CHARS_PER_TOKEN
    fixed = lambda text: -(-len(re.sub(r"\{(prompt|a|b|response)\}", "", text or "")) // rate)
    head = first_segment(t, a="", b="")  # the item's text up to its first response ("" pointwise)
    prefix = fixed((t.system or "") + t.context) + (0 if toy else CHAT_FORMAT_TOKENS)
    return prefix, fixed(head), fixed(t.item) - fixed(head)


class JudgeWork(NamedTuple):
    """One judge call over `prompts` prompts (a step's rewards, or the judged evaluation): `questions` asked in all,
    `chunk` (P, F, S, C) the engine runs them in (prefixes, firsts, questions, votes), the slots of each level
    (`prefix`, `first` (0: none shared), `rest`: padded to their length buckets), the prefill tokens with the tree
    and without it (`flat`), the tokens decoded at most, and the questions early-stopped voting asks at least
    (every pair decided by its first round; `questions` when the construction votes in full)."""

    prompts: int
    questions: int
    chunk: tuple[int, int, int, int]
    prefix: int
    first: int
    rest: int
    prefill_tokens: int
    flat_prefill_tokens: int
    decode_tokens: int
    early_questions: int

    @property
    def rows(self) -> int:
        """The rows of a chunk."""
        return math.prod(self.chunk)


@functools.lru_cache(maxsize=64)  # every candidate mesh of a plan asks the same call
def judge_chunk(load: JudgeLoad, prompts: int, max_batch: int, lengths: tuple[int, int, int], extra: int = 0,
                max_slots: int | None = None) -> tuple[int, int, int, int]:
    """(P, F, S, C) of the one chunk shape the engine runs `prompts` prompts' questions in, each asking as `load`
    says: `firsts` responses shown first, each before `distinct / firsts` others, every question asked
    `questions / distinct` times; chosen by the engine's own `question_tree.call_shape` for level `lengths`
    (prefix, first, rest: padded), `extra` tokens decoded, as `JaxSampler` chooses it with
    `max_batch_tokens=max_slots`."""
    firsts = max(load.firsts, 1)
    seconds, copies = -(-load.leaves // firsts), -(-load.questions // load.leaves)
    suffixes = [(o, [f, k]) for o in range(prompts) for f in range(firsts) for k in range(seconds)
                for _ in range(copies)]
    tree = question_tree.question_tree(suffixes, [1 if load.firsts else 0] * len(suffixes))
    fans = question_tree.fan_outs(max_batch)
    counts = question_tree.cut_counts(question_tree.pieces(tree, max_batch), fans)
    shape, _ = question_tree.call_shape(fans, counts, lengths, extra, max_batch, 1, max_slots)
    return shape[:4]


def judge_work(s, load: JudgeLoad, prompts: int) -> JudgeWork:
    """The `JudgeWork` of `prompts` prompts asking as `load` says, for the trainer's settings `s` (the responses
    are `rl.max_new_tokens` long, the prompts `data.max_prompt_tokens`)."""
    n_new = s.rollout.max_new_tokens
    pre, head, tail = template_tokens(s)
    prefix = length_bucket(s.prompts.data.max_prompt_tokens + pre)
    flat = length_bucket(2 * n_new + head + tail)
    shared = load.firsts and load.leaves > load.firsts  # a first response before several questions: a level
    first, rest = (length_bucket(n_new + head), length_bucket(n_new + tail)) if shared else (0, flat)
    per_prompt = prefix + (load.firsts * first if shared else 0) + load.leaves * rest
    chunk = judge_chunk(load, prompts, s.judge.max_batch, (prefix, first, rest), s.judge.max_new_tokens,
                        s.judge.max_batch_tokens)
    return JudgeWork(prompts, load.questions * prompts, chunk, prefix,
                     first, rest, prompts * per_prompt, prompts * (prefix + load.questions * flat),
                     prompts * load.tokens, prompts * early_questions(s, load))


def early_questions(s, load: JudgeLoad) -> int:
    """The fewest questions a prompt's pairs ask with early-stopped voting (`reward.judge.early_stop` on SCR's round
    robin without CARA, or AGR): every pair decided by its first round (`votes_to_decide`); `load.questions` when
    the construction votes in full."""
    own, votes = s.reward_settings, s.judge.votes
    if not s.judge.early_stop or s.reward_kind not in ("scr", "agr") or getattr(own, "cara", False) or (
            getattr(own, "ordering", "round_robin") != "round_robin"):
        return load.questions
    first = int(votes_to_decide([0], [0], [votes], pair_outcome(own.ties, s.reward_kind))[0])
    return load.questions // votes * first
