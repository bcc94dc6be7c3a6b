"""Prompt sets for RL and the grain pipeline that serves them.

`load_prompts(config)` returns the training and held-out `PromptSet`s: the toy task's (generated from
`toy.seed`, with the oracle quality) or the rows of a source (`data.path`, `data.eval_path`: a jsonl / json / csv
file, optionally gzipped, a parquet file, a `save_to_disk` folder or a Hub dataset's `data.split`; read by
`rrc_jax.data.sources.read_rows`), the prompt in `data.field`. A prompt is a string or a chat conversation (a list
of `{role, content}` messages ending with a user turn): the policy sees the whole conversation, system message and
earlier turns included, through its chat template (`PromptSet.chats`); a judge reads it as one text
(`render_conversation`). Rows with no usable prompt are dropped and counted in the log.

With `data.format` (a preference format, or `pairs` of the toy task), the prompts are judge questions instead
(`preference_questions`): each preference rendered in `reward.judge.template`, its A/B order random, the oracle
scoring a judgment 1 when its verdict is correct. RLVR (`reward.kind='rlvr'`) trains the policy on them as a judge.

Held-out prompts: `data.eval_path` when given; otherwise the last tenth of the training file (at most
`data.eval_prompts` rows), which needs at least 10 usable rows; `data.eval_prompts=0` holds out nothing (no
evaluation). The log states the split (how many rows, from where). Ids never collide: a file's prompts are
numbered by their row among the usable ones, and a separate eval file's continue after the training file's.

`prompt_batches(config, n)` yields `[prompts_per_step]` arrays of prompt indices: shuffled (per epoch, from the
seed), repeated, sharded across hosts, with `get_state()` / `set_state()` for checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import grain
import jax
import numpy as np
from absl import logging

from rrc_jax.data.sources import read_rows
from rrc_jax.errors import ConfigError

MIN_SPLIT_ROWS = 10  # a training file split into train + held-out needs this many usable rows


@dataclasses.dataclass(frozen=True)
class PromptSet:
    """Prompt `texts` with stable integer `ids`; `oracle(index, response) -> q` on the toy task (and for judge
    questions: 1 for the correct verdict), else None. `rendered`: the texts are the model's whole input already
    (judge questions in their template and chat format), tokenized as they are (`prompt_tokens`)."""

    ids: list[int]
    texts: list[str]
    oracle: Callable[[int, str], float] | None = None
    rendered: bool = False
    paired: bool = False  # pointwise judge questions: 2k about a preference's chosen response, 2k + 1 its rejected
    chats: dict[str, list[dict]] | None = None  # text -> the conversation it renders, for multi-turn prompts

    def split(self, k: int) -> tuple[PromptSet, PromptSet]:
        """(all but the last `k` prompts, the last `k`), each with its own conversations."""
        n = len(self.texts)
        head, tail = (PromptSet(self.ids[a:b], self.texts[a:b], self.oracle, self.rendered, self.paired, self.chats)
                      for a, b in ((0, n - k), (n - k, n)))
        return head, tail


def prompt_tokens(tokenizer, prompts: PromptSet, text: str) -> list[int]:
    """The token ids the policy sees for one of `prompts`' texts: as rendered, or in the chat template (the whole
    conversation of a multi-turn prompt)."""
    from rrc_jax.judge.prompts import encode_text
    from rrc_jax.models import prompt_ids

    if prompts.rendered:
        return encode_text(tokenizer, text, first=True)
    return prompt_ids(tokenizer, (prompts.chats or {}).get(text, text))


def judge_questions(prefs, tokenizer, template, seed: int, first_id: int = 0) -> PromptSet:
    """Preferences as pairwise judge questions in `template` (rendered for `tokenizer`'s chat template), each with
    its A/B order drawn from `seed`; `oracle(i, judgment)` is 1 when the judgment's verdict (`parse_verdict`) names
    the chosen response, else 0 (a wrong verdict or an abstention)."""
    from rrc_jax.judge.prompts import get_template, render_parts
    from rrc_jax.judge.verdicts import parse_verdict

    template = get_template(template)
    rng = np.random.default_rng(seed)
    texts, answers = [], []
    for p in prefs:
        chosen_first = bool(rng.random() < 0.5)
        a, b = (p.chosen, p.rejected) if chosen_first else (p.rejected, p.chosen)
        texts.append("".join(render_parts(tokenizer, template, p.prompt, a=a, b=b)))
        answers.append("A" if chosen_first else "B")
    return PromptSet(list(range(first_id, first_id + len(texts))), texts,
                     lambda i, judgment: float(parse_verdict(judgment) == answers[i]), rendered=True)


def pointwise_questions(prefs, tokenizer, template, first_id: int = 0) -> PromptSet:
    """Preferences as pointwise judge questions in `template` (IRPO): question 2k scores preference k's chosen
    response, 2k + 1 its rejected one (`paired`); no oracle (a pair's questions are judged together)."""
    from rrc_jax.judge.prompts import get_template, render_parts

    template = get_template(template)
    if template.kind != "pointwise":
        raise ConfigError(f"config.reward.judge.template: {template.name!r} is {template.kind}; IRPO needs a "
                          "pointwise template (e.g. 'irpo_pointwise')")
    texts = ["".join(render_parts(tokenizer, template, p.prompt, response=r)) for p in prefs
             for r in (p.chosen, p.rejected)]
    return PromptSet(list(range(first_id, first_id + len(texts))), texts, rendered=True, paired=True)


def preference_questions(config, tokenizer) -> tuple[PromptSet, PromptSet]:
    """(training, held-out) judge questions of `config.data` in `data.format` (module docstring): the toy task's
    pairs (`data.path='toy'`, held-out prompts disjoint from the training ones) or a preference dataset's."""
    d, template = config.data, config.reward.judge.template
    if d.path == "toy":
        from rrc_jax.data.toy.task import SortTask
        from rrc_jax.data.toy.world import toy_preferences

        t = config.toy
        task = SortTask(t.min_len, t.max_len, t.noise)
        rng = np.random.default_rng(30_000 + t.seed)
        train = toy_preferences(task, t.train_prompts, rng, name="toy-train")
        held = toy_preferences(task, d.eval_prompts, rng, held_out=True, name="toy-eval")  # the evaluation split
    else:
        from rrc_jax.data.preferences import load_preferences

        train = load_preferences(d.path, d.format, split=d.split).prefs
        if d.eval_path:
            held = load_preferences(d.eval_path, d.format, split=d.split, limit=d.eval_prompts).prefs
        else:
            k = held_out_count(len(train), d)
            train, held = train[:len(train) - k], train[len(train) - k:]
        say_split(len(train), len(held), d)
    if config.reward.kind == "irpo":
        return (pointwise_questions(train, tokenizer, template),
                pointwise_questions(held, tokenizer, template, first_id=2 * len(train)))
    return (judge_questions(train, tokenizer, template, config.seed),
            judge_questions(held, tokenizer, template, config.seed + 1, first_id=len(train)))


def toy_prompts(config) -> tuple[PromptSet, PromptSet]:
    from rrc_jax.data.toy.task import SortTask, oracle_quality

    t = config.toy
    task = SortTask(t.min_len, t.max_len, t.noise)
    rng = np.random.default_rng(10_000 + t.seed)
    train_digits = [task.prompt(rng) for _ in range(t.train_prompts)]
    eval_digits, seen = [], set()
    while len(eval_digits) < config.data.eval_prompts:  # distinct prompts of the evaluation split (never trained on)
        d = task.prompt(rng, held_out=True)
        if d not in seen:
            eval_digits.append(d)
            seen.add(d)

    def make(digits: list[str], offset: int) -> PromptSet:
        return PromptSet(list(range(offset, offset + len(digits))), [task.prompt_text(d) for d in digits],
                         lambda i, response: oracle_quality(digits[i], response))

    return make(train_digits, 0), make(eval_digits, len(train_digits))


def _prompt_of(row: dict, field: str) -> tuple[str, list[dict] | None] | None:
    """(the prompt's text, its conversation when it has several turns) of a row, None when unusable: a non-empty
    string, or `{role, content}` messages ending with a non-empty user turn."""
    from rrc_jax.data.preferences import BadRow, context_text

    value = row.get(field)
    try:
        text = context_text(value)
    except BadRow:
        return None
    chat = [{"role": m["role"], "content": m["content"] or ""} for m in value] if isinstance(value, list) else None
    return text, chat if chat and len(chat) > 1 else None


def file_prompts(path: str, field: str, limit: int | None = None, first_id: int = 0, setting: str = "data.path",
                 split: str = "train") -> PromptSet:
    """The usable prompts of a source (module docstring), ids `first_id, first_id + 1, ...`; `setting` names the
    config field in errors."""
    try:
        ds, name = read_rows(path, split)
    except ConfigError as e:
        raise ConfigError(f"config.{setting}: {e}") from None
    if field not in ds.column_names:
        raise ConfigError(f"config.data.field: {name} has no field {field!r}; its fields are "
                          f"{', '.join(ds.column_names)}")
    texts, chats, dropped = [], {}, 0
    for row in ds:
        got = _prompt_of(row, field)
        if got is None:
            dropped += 1
            continue
        texts.append(got[0])
        if got[1]:
            chats[got[0]] = got[1]
        if limit and len(texts) >= limit:
            break
    if dropped:
        logging.warning("%s: dropped %d rows with an empty or malformed %r", name, dropped, field)
    if not texts:
        raise ConfigError(f"config.{setting}: {name} has no usable prompt in field {field!r}")
    return PromptSet(list(range(first_id, first_id + len(texts))), texts, chats=chats or None)


def held_out_count(n: int, data) -> int:
    """How many of `n` training rows are held out when there is no `data.eval_path`: a tenth, at most
    `data.eval_prompts` (0: none)."""
    if not data.eval_prompts:
        return 0
    if n < MIN_SPLIT_ROWS:
        raise ConfigError(f"config.data.path: {data.path} has {n} usable rows; holding out a tenth for evaluation "
                          f"needs at least {MIN_SPLIT_ROWS}. Add rows, give config.data.eval_path, or set "
                          "config.data.eval_prompts=0 (no evaluation)")
    return min(data.eval_prompts, n // 10)


def say_split(n_train: int, n_held: int, data) -> None:
    """State where the held-out rows came from (process 0)."""
    from rrc_jax.progress import say

    if data.eval_path:
        where = f"from {data.eval_path}"
    elif n_held:
        where = f"the last {n_held} rows of {data.path} (set data.eval_path, or data.eval_prompts=0 for none)"
    else:
        where = "none (data.eval_prompts=0): no held-out evaluation"
    say(f"data: {n_train} training rows from {data.path}; held out: {n_held}, {where}")


def load_prompts(config, tokenizer=None) -> tuple[PromptSet, PromptSet]:
    """(training prompts, held-out prompts) of `config.data` (module docstring); judge questions
    (`preference_questions`, rendered for the policy's `tokenizer`) when `data.format` is set."""
    d = config.data
    if d.format:
        return preference_questions(config, tokenizer)
    if d.path == "toy":
        return toy_prompts(config)
    train = file_prompts(d.path, d.field, split=d.split)
    if d.eval_path:
        held = file_prompts(d.eval_path, d.field, limit=d.eval_prompts, first_id=len(train.texts),
                            setting="data.eval_path", split=d.split)
    else:  # the tail of the training file, ids after the training ones
        train, held = train.split(held_out_count(len(train.texts), d))
    say_split(len(train.texts), len(held.texts), d)
    return train, held


def prompt_batches(config, n: int, paired: bool = False):
    """A checkpointable grain iterator of `[prompts_per_step]` int arrays of prompt indices for this host; with
    `paired`, whole pairs `2k, 2k + 1` (a `PromptSet.paired` set's questions about one preference)."""
    b = config.rl.prompts_per_step
    hosts, host = jax.process_count(), jax.process_index()
    unit = 2 if paired else 1
    if b % (hosts * unit):
        raise ConfigError(f"config.rl.prompts_per_step={b} must be divisible by the number of hosts ({hosts})"
                          + (" x 2 (IRPO asks about both responses of a pair in one step)" if paired else ""))
    ds = grain.MapDataset.range(n // unit).shuffle(seed=config.seed).repeat()
    ds = ds[host::hosts].batch(b // hosts // unit, drop_remainder=True)
    if paired:
        ds = ds.map(lambda k: np.stack([2 * k, 2 * k + 1], axis=1).reshape(-1))
    return iter(ds.to_iter_dataset())
