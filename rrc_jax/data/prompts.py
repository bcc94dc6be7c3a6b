"""Prompt sets for RL and the grain pipeline that serves them.

`load_prompts(source)` returns the training and held-out `PromptSet`s of a `PromptSource` (`data`, the toy task's
`toy`, the judge template, the seed): the toy task's (generated from `toy.seed`, with the oracle quality), the
packaged chat set's (`data.path="chat"`: `rrc_jax.data.chat`, its oracle 1 when a response holds the prompt's
answer, else 0; `chat_prompts`) or the rows of a source (`data.path`, `data.eval_path`: a jsonl / json / csv
file, optionally gzipped, a parquet file, a `save_to_disk` folder or a Hub dataset's `data.split`; read by
`rrc_jax.data.sources.read_rows`), the prompt in `data.field`. A prompt is a string or a chat conversation (a list
of `{role, content}` messages ending with a user turn): the policy sees the whole conversation, system message and
earlier turns included, through its chat template (`PromptSet.chats`); a judge reads it as one text
(`rrc_jax.models.render_conversation`). Rows with no usable prompt are dropped and counted in the log. A malformed JSON line is
an error naming the file and line, or with `data.skip_bad_rows=True` skipped and counted.

Prompts too long for the models are dropped at load (`load_prompts(..., max_tokens)`, the trainer's
`prompt_token_limit`: `data.max_prompt_tokens` at most, and what fits the policy's and the judge's contexts with
their generation budgets), counted, with the first few rows in the log. Every set says what was left out of it in
`PromptSet.counts` (`COUNTS`).

With `data.format` (a preference format, or `pairs` of the toy task), the prompts are judge questions instead
(`preference_questions`): each preference rendered in `reward.judge.template`, its A/B order random, the oracle
scoring a judgment 1 when its verdict is correct. RLVR (`reward.kind='rlvr'`) trains the policy on them as a judge.

Held-out prompts: `data.eval_path` when given; otherwise the last tenth of the training file (at most
`data.eval_prompts` rows), which needs at least 10 usable rows; `data.eval_prompts=0` holds out nothing (no
evaluation). The log states the split (how many rows, from where). Ids never collide: a file's prompts are
numbered by their row among the usable ones, and a separate eval file's continue after the training file's.

`prompt_batches(prompts_per_step, seed, n)` yields `[prompts_per_step]` arrays of prompt indices: shuffled (per
epoch, from the seed), repeated, sharded across hosts, with `get_state()` / `set_state()` for checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import grain
import jax
import numpy as np
from absl import logging

from rrc_jax.data import chat
from rrc_jax.data.preferences import BadRow, context_text, load_preferences
from rrc_jax.data.sources import read_rows
from rrc_jax.data.toy.task import ToyTaskConfig, held_out_prompt_count, oracle_quality, toy_preferences
from rrc_jax.errors import ConfigError
from rrc_jax.judge.templates import encode_text, get_template, render_parts
from rrc_jax.judge.verdicts import parse_verdict
from rrc_jax.models import prompt_ids
from rrc_jax.progress import say

MIN_SPLIT_ROWS = 10  # a training file split into train + held-out needs this many usable rows
MAX_LISTED = 5  # rows (lines) named in a log line about dropped ones
COUNTS = ("bad_rows_skipped", "unusable_dropped", "dropped_long")  # PromptSet.counts: malformed JSON lines skipped,
# rows without a usable prompt, prompts longer than load_prompts' max_tokens
JUDGE_TEMPLATE_SLACK = 32  # tokens a judge question may take beyond its template's measured text (chat markup, a
# judge tokenizer that splits the texts it shows finer than the policy's)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where a trainer's prompts come from (`data`; the module docstring says how each source is read)."""

    GROUP: ClassVar[str] = "data"
    path: str = "toy"  # "toy"; "chat" (the packaged chat set); a jsonl / json / csv (maybe .gz) / parquet file, a
    # save_to_disk folder, a Hub name
    field: str = "prompt"  # the prompt's field: a string or chat messages
    split: str = "train"
    format: str = ""  # a preference format (helpsteer3, rmbench, judgebench, pairs): the prompts are judge questions
    eval_path: str = ""  # held out; default the last tenth of `path`, at most `eval_prompts`
    eval_prompts: int = 256  # 0: no held-out split
    max_prompt_tokens: int = 512  # longer prompts (or than the contexts fit) are dropped and counted
    skip_bad_rows: bool = False  # skip and count malformed JSON lines instead of an error naming the first

    def __post_init__(self):
        if self.eval_prompts < 0 or self.max_prompt_tokens < 1:
            raise ConfigError(f"config.data: eval_prompts={self.eval_prompts} must be >= 0 (0: no held-out split) "
                              f"and max_prompt_tokens={self.max_prompt_tokens} >= 1")
        if self.path == "chat" and (self.eval_path or self.field != "prompt"):
            raise ConfigError("config.data.path='chat': the packaged chat set holds out its own last rows (a tenth, "
                              "at most data.eval_prompts) from its field 'prompt'; unset data.eval_path and "
                              "data.field")


@dataclasses.dataclass(frozen=True)
class PromptSource:
    """Everything `load_prompts` reads: `data`, the toy task's prompts (`toy`), the judge template judge questions
    are rendered in (`reward.judge.template`) and the seed of their A/B orders (`seed`)."""

    data: DataConfig
    toy: ToyTaskConfig
    template: str
    seed: int


def _no_counts() -> dict[str, int]:
    return dict.fromkeys(COUNTS, 0)


@dataclasses.dataclass(frozen=True)
class PromptSet:
    """Prompt `texts` with stable integer `ids`; `oracle(index, response) -> q` on the toy task (and for judge
    questions: 1 for the correct verdict), else None. `rendered`: the texts are the model's whole input already
    (judge questions in their template and chat format), tokenized as they are (`prompt_tokens`). `rows`: each
    prompt's 0-based row in its source, for messages (None: its id). `counts`: what was left out of the set, by
    `COUNTS` (a split file's go with its training part)."""

    ids: list[int]
    texts: list[str]
    oracle: Callable[[int, str], float] | None = None
    rendered: bool = False
    paired: bool = False  # pointwise judge questions: 2k about a preference's chosen response, 2k + 1 its rejected
    chats: dict[str, list[dict]] | None = None  # text -> the conversation it renders, for multi-turn prompts
    rows: list[int] | None = None
    counts: dict[str, int] = dataclasses.field(default_factory=_no_counts)

    def split(self, k: int) -> tuple[PromptSet, PromptSet]:
        """(all but the last `k` prompts, the last `k`), each with its own conversations."""
        n = len(self.texts)
        head, tail = (dataclasses.replace(self, ids=self.ids[a:b], texts=self.texts[a:b],
                                          rows=None if self.rows is None else self.rows[a:b])
                      for a, b in ((0, n - k), (n - k, n)))
        return head, dataclasses.replace(tail, counts=_no_counts())

    def row(self, index: int) -> int:
        """The source row of prompt `index` (its id when the set has no rows)."""
        return self.ids[index] if self.rows is None else self.rows[index]


def prompt_tokens(tokenizer, prompts: PromptSet, text: str) -> list[int]:
    """The token ids the policy sees for one of `prompts`' texts: as rendered, or in the chat template (the whole
    conversation of a multi-turn prompt)."""
    if prompts.rendered:
        return encode_text(tokenizer, text, first=True)
    return prompt_ids(tokenizer, (prompts.chats or {}).get(text, text))


def _rows_of(prefs) -> list[int] | None:
    """The source rows of preferences, from their keys `NAME:ROW` (None when a key has no row)."""
    rows = [p.key.rpartition(":")[2] for p in prefs]
    return [int(r) for r in rows] if all(r.isdigit() for r in rows) else None


def judge_questions(prefs, tokenizer, template, seed: int, first_id: int = 0) -> PromptSet:
    """Preferences as pairwise judge questions in `template` (rendered for `tokenizer`'s chat template), each with
    its A/B order drawn from `seed`; `oracle(i, judgment)` is 1 when the judgment's verdict (`parse_verdict`) names
    the chosen response, else 0 (a wrong verdict or an abstention)."""
    template = get_template(template)
    rng = np.random.default_rng(seed)
    texts, answers = [], []
    for p in prefs:
        chosen_first = bool(rng.random() < 0.5)
        a, b = (p.chosen, p.rejected) if chosen_first else (p.rejected, p.chosen)
        texts.append("".join(render_parts(tokenizer, template, p.prompt, a=a, b=b)))
        answers.append("A" if chosen_first else "B")
    return PromptSet(list(range(first_id, first_id + len(texts))), texts,
                     lambda i, judgment: float(parse_verdict(judgment) == answers[i]), rendered=True,
                     rows=_rows_of(prefs))


def pointwise_questions(prefs, tokenizer, template, first_id: int = 0) -> PromptSet:
    """Preferences as pointwise judge questions in `template` (IRPO): question 2k scores preference k's chosen
    response, 2k + 1 its rejected one (`paired`); no oracle (a pair's questions are judged together)."""
    template = get_template(template)
    if template.kind != "pointwise":
        raise ConfigError(f"config.reward.judge.template: {template.name!r} is {template.kind}; IRPO needs a "
                          "pointwise template (e.g. 'irpo_pointwise')")
    texts = ["".join(render_parts(tokenizer, template, p.prompt, response=r)) for p in prefs
             for r in (p.chosen, p.rejected)]
    rows = _rows_of(prefs)
    return PromptSet(list(range(first_id, first_id + len(texts))), texts, rendered=True, paired=True,
                     rows=None if rows is None else [r for r in rows for _ in range(2)])


def preference_questions(source: PromptSource, tokenizer, questions: str = "pairwise"
                         ) -> tuple[PromptSet, PromptSet]:
    """(training, held-out) judge questions of `source.data` in `data.format` (module docstring): the toy task's
    pairs (`data.path='toy'`, held-out prompts disjoint from the training ones) or a preference dataset's;
    `questions` 'pairwise' (`judge_questions`) or 'pointwise' (`pointwise_questions`, in pairs), as the reward
    construction asks (`Construction.questions`)."""
    d, template, seed = source.data, source.template, source.seed
    skipped = 0
    if d.path == "toy":
        t = source.toy
        task = t.task
        rng = np.random.default_rng(30_000 + t.seed)
        train = toy_preferences(task, t.train_prompts, rng, name="toy-train")
        held = toy_preferences(task, d.eval_prompts, rng, held_out=True, name="toy-eval")  # the evaluation split
    else:
        skip = d.skip_bad_rows
        loaded = load_preferences(d.path, d.format, split=d.split, skip_bad_rows=skip)
        train, skipped = loaded.prefs, loaded.counts["bad_rows_skipped"]
        if d.eval_path:
            held = load_preferences(d.eval_path, d.format, split=d.split, limit=d.eval_prompts,
                                    skip_bad_rows=skip).prefs
        else:
            k = held_out_count(len(train), d)
            train, held = train[:len(train) - k], train[len(train) - k:]
        say_split(len(train), len(held), d)
    if questions == "pointwise":
        train_q = pointwise_questions(train, tokenizer, template)
        held_q = pointwise_questions(held, tokenizer, template, first_id=2 * len(train))
    else:
        train_q = judge_questions(train, tokenizer, template, seed)
        held_q = judge_questions(held, tokenizer, template, seed + 1, first_id=len(train))
    return dataclasses.replace(train_q, counts={**train_q.counts, "bad_rows_skipped": skipped}), held_q


def check_toy_eval_prompts(source: PromptSource) -> None:
    """A `ConfigError` when `data.eval_prompts` asks for more distinct held-out toy prompts than the evaluation
    split has (`held_out_prompt_count` of `toy.min_len`..`toy.max_len` digits): drawing them would never end."""
    t, want = source.toy, source.data.eval_prompts
    most = held_out_prompt_count(t.min_len, t.max_len)
    if want > most:
        raise ConfigError(f"config.data.eval_prompts={want}: the toy task has only {most} distinct held-out prompts "
                          f"({t.min_len}-{t.max_len} digits, toy.min_len / toy.max_len); set data.eval_prompts "
                          f"<= {most} or raise toy.max_len")


def toy_prompts(source: PromptSource) -> tuple[PromptSet, PromptSet]:
    """(training, held-out) prompts of the toy task: `toy.train_prompts` drawn from the training split, and
    `data.eval_prompts` distinct ones of the evaluation split (at most `check_toy_eval_prompts`' maximum)."""
    check_toy_eval_prompts(source)
    t = source.toy
    task = t.task
    rng = np.random.default_rng(10_000 + t.seed)
    train_digits = [task.prompt(rng) for _ in range(t.train_prompts)]
    eval_digits, seen = [], set()
    while len(eval_digits) < source.data.eval_prompts:  # distinct prompts of the evaluation split (never trained on)
        d = task.prompt(rng, held_out=True)
        if d not in seen:
            eval_digits.append(d)
            seen.add(d)

    def make(digits: list[str], offset: int) -> PromptSet:
        return PromptSet(list(range(offset, offset + len(digits))), [task.prompt_text(d) for d in digits],
                         lambda i, response: oracle_quality(digits[i], response))

    return make(train_digits, 0), make(eval_digits, len(train_digits))


def with_answers(prompts: PromptSet, answers: list[str]) -> PromptSet:
    """`prompts` (rows of the chat set) with the oracle `oracle(i, response)`: 1.0 when the response holds the
    answer of prompt i's row (`rrc_jax.data.chat.contains_answer`), else 0.0."""
    def oracle(i: int, response: str) -> float:
        return float(chat.contains_answer(response, answers[prompts.row(i)]))

    return dataclasses.replace(prompts, oracle=oracle)


def chat_prompts(data: DataConfig) -> tuple[PromptSet, PromptSet]:
    """(training, held-out) prompts of the packaged chat set (`rrc_jax.data.chat`, 96 rows): the last tenth of its
    rows held out (at most `data.eval_prompts`; none with 0), each set with the answer oracle (`with_answers`)."""
    whole = file_prompts(str(chat.PATH), "prompt")
    train, held = whole.split(held_out_count(len(whole.texts), data))
    say_split(len(train.texts), len(held.texts), data)
    answers = chat.answers()
    return with_answers(train, answers), with_answers(held, answers)


def _prompt_of(row: dict, field: str) -> tuple[str, list[dict] | None] | None:
    """(the prompt's text, its conversation when it has several turns) of a row, None when unusable: a non-empty
    string, or `{role, content}` messages ending with a non-empty user turn."""
    value = row.get(field)
    try:
        text = context_text(value)
    except BadRow:
        return None
    chat = [{"role": m["role"], "content": m["content"] or ""} for m in value] if isinstance(value, list) else None
    return text, chat if chat and len(chat) > 1 else None


def file_prompts(path: str, field: str, limit: int | None = None, first_id: int = 0, setting: str = "data.path",
                 split: str = "train", skip_bad_rows: bool = False) -> PromptSet:
    """The usable prompts of a source (module docstring), ids `first_id, first_id + 1, ...`; `setting` names the
    config field in errors. `skip_bad_rows`: malformed JSON lines are skipped (counted, named in the log) instead
    of an error naming the first."""
    bad: list[tuple[int, str]] | None = [] if skip_bad_rows else None
    try:
        ds, name = read_rows(path, split, bad_lines=bad)
    except ConfigError as e:
        raise ConfigError(f"config.{setting}: {e}") from None
    if bad:
        listed = "; ".join(f"{name}:{line}: {why}" for line, why in bad[:MAX_LISTED])
        more = "; ..." if len(bad) > MAX_LISTED else ""
        say(f"data: skipped {len(bad)} malformed JSON lines of {name} ({listed}{more})")
    if field not in ds.column_names:
        raise ConfigError(f"config.data.field: {name} has no field {field!r}; its fields are "
                          f"{', '.join(ds.column_names)}")
    texts, chats, rows, dropped = [], {}, [], 0
    for row, record in enumerate(ds):
        got = _prompt_of(record, field)
        if got is None:
            dropped += 1
            continue
        texts.append(got[0])
        rows.append(row)
        if got[1]:
            chats[got[0]] = got[1]
        if limit and len(texts) >= limit:
            break
    if dropped:
        logging.warning("%s: dropped %d rows with an empty or malformed %r", name, dropped, field)
    if not texts:
        raise ConfigError(f"config.{setting}: {name} has no usable prompt in field {field!r}")
    return PromptSet(list(range(first_id, first_id + len(texts))), texts, chats=chats or None, rows=rows,
                     counts={**_no_counts(), "bad_rows_skipped": len(bad or []), "unusable_dropped": dropped})


def held_out_count(n: int, data) -> int:
    """How many of `n` training rows are held out when there is no `data.eval_path`: a tenth, at most
    `data.eval_prompts` (0: none)."""
    if not data.eval_prompts:
        return 0
    if n < MIN_SPLIT_ROWS:
        raise ConfigError(f"config.data.path: {data.path} has {n} usable prompts; holding out a tenth for evaluation "
                          f"needs at least {MIN_SPLIT_ROWS}. Add rows, give config.data.eval_path, or set "
                          "config.data.eval_prompts=0 (no evaluation)")
    return min(data.eval_prompts, n // 10)


def say_split(n_train: int, n_held: int, data) -> None:
    """State where the held-out rows came from (process 0)."""
    if data.eval_path:
        where = f"from {data.eval_path}"
    elif n_held:
        where = f"the last {n_held} rows of {data.path} (set data.eval_path, or data.eval_prompts=0 for none)"
    else:
        where = "none (data.eval_prompts=0): no held-out evaluation"
    say(f"data: {n_train} training rows from {data.path}; held out: {n_held}, {where}")


def judge_template_tokens(template, tokenizer=None) -> int:
    """What a judge question in `template` (and its direct variant, if any) adds to the texts it shows, generously:
    its text rendered around empty ones, in `tokenizer`'s tokens (without one: in characters, more than the
    tokens of any sub-word tokenizer), plus `JUDGE_TEMPLATE_SLACK`."""
    template = get_template(template)
    most = 0
    for t in (template,) + ((get_template(template.direct),) if template.direct is not None else ()):
        empty = {"a": "", "b": ""} if t.kind == "pairwise" else {"response": ""}
        text = "".join(render_parts(tokenizer, t, "", **empty))
        most = max(most, len(text) if tokenizer is None else len(encode_text(tokenizer, text, first=True)))
    return most + JUDGE_TEMPLATE_SLACK


def prompt_token_limit(max_prompt_tokens: int, max_new_tokens: int, policy_context: int, judge=None,
                       judge_context: int | None = None, judge_tokenizer=None) -> int:
    """The longest prompt a run takes (`load_prompts`' `max_tokens`): `data.max_prompt_tokens`, at most the
    policy's context less `rl.max_new_tokens`, and with a judge (`judge`: its `template` and `max_new_tokens`,
    `reward.judge`; `judge_context`: its model's context) at most that less what a question about the prompt adds:
    the judgment, the responses shown (two in a pairwise template, one in a pointwise one) and the template
    (`judge_template_tokens`, measured with `judge_tokenizer` when given). A `ConfigError` when no prompt fits."""
    limit = min(max_prompt_tokens, policy_context - max_new_tokens)
    why = f"the policy's context ({policy_context}) less rl.max_new_tokens={max_new_tokens}"
    if judge is not None and judge_context is not None:
        template = get_template(judge.template)
        shown = 2 if template.kind == "pairwise" else 1
        fits = (judge_context - judge.max_new_tokens - shown * max_new_tokens
                - judge_template_tokens(template, judge_tokenizer))
        if fits < limit:
            limit, why = fits, (f"the judge's context ({judge_context}) less reward.judge.max_new_tokens="
                                f"{judge.max_new_tokens}, {shown} x rl.max_new_tokens={max_new_tokens} and the "
                                f"template {template.name!r}")
    if limit < 1:
        raise ConfigError(f"config: no room for a prompt: {why} leaves {limit} tokens; lower the generation "
                          "budgets or use models with a longer context")
    return limit


def drop_long(prompts: PromptSet, tokenizer, max_tokens: int, what: str) -> PromptSet:
    """`prompts` without those of more than `max_tokens` tokens as the policy sees them (`prompt_tokens`; a
    paired set's pairs go together), counted in `counts["dropped_long"]` and said with their first rows; its oracle
    follows the prompts kept. `what` names the set in messages. A `ConfigError` when every prompt is too long."""
    long = np.array([len(prompt_tokens(tokenizer, prompts, t)) > max_tokens for t in prompts.texts], bool)
    if prompts.paired:
        long = long.reshape(-1, 2).any(axis=1).repeat(2)
    if not long.any():
        return prompts
    if long.all():
        raise ConfigError(f"config.data.max_prompt_tokens: all {len(long)} {what} are longer than {max_tokens} "
                          "tokens (data.max_prompt_tokens, or what fits the policy's and the judge's contexts with "
                          "their generation budgets); give shorter prompts, lower rl.max_new_tokens / "
                          "reward.judge.max_new_tokens or use models with a longer context")
    keep = np.flatnonzero(~long).tolist()
    rows = list(dict.fromkeys(prompts.row(i) for i in np.flatnonzero(long)))
    listed = ", ".join(map(str, rows[:MAX_LISTED])) + (", ..." if len(rows) > MAX_LISTED else "")
    say(f"data: dropped {int(long.sum())} {what} longer than {max_tokens} tokens (rows {listed})")
    oracle = prompts.oracle
    if oracle is not None:
        def oracle(i: int, response: str, _whole=prompts.oracle) -> float:  # indices of the kept prompts
            return _whole(keep[i], response)
    return dataclasses.replace(
        prompts, ids=[prompts.ids[i] for i in keep], texts=[prompts.texts[i] for i in keep], oracle=oracle,
        rows=None if prompts.rows is None else [prompts.rows[i] for i in keep],
        counts={**prompts.counts, "dropped_long": prompts.counts.get("dropped_long", 0) + int(long.sum())})


def load_prompts(source: PromptSource, tokenizer=None, max_tokens: int | None = None, questions: str = "pairwise"
                 ) -> tuple[PromptSet, PromptSet]:
    """(training prompts, held-out prompts) of `source.data` (module docstring); judge questions
    (`preference_questions` of kind `questions`, rendered for the policy's `tokenizer`) when `data.format` is set.
    `max_tokens` (`prompt_token_limit`; needs the `tokenizer`): prompts longer than that are dropped
    (`drop_long`)."""
    d = source.data
    if max_tokens is not None and tokenizer is None:
        raise ValueError("load_prompts: max_tokens needs the policy's tokenizer (prompt lengths are in its tokens)")
    if d.format:
        train, held = preference_questions(source, tokenizer, questions)
    elif d.path == "toy":
        train, held = toy_prompts(source)
    elif d.path == "chat":
        train, held = chat_prompts(d)
    else:
        skip = d.skip_bad_rows
        train = file_prompts(d.path, d.field, split=d.split, skip_bad_rows=skip)
        if d.eval_path:
            held = file_prompts(d.eval_path, d.field, limit=d.eval_prompts, first_id=len(train.texts),
                                setting="data.eval_path", split=d.split, skip_bad_rows=skip)
        else:  # the tail of the training file, ids after the training ones
            train, held = train.split(held_out_count(len(train.texts), d))
        say_split(len(train.texts), len(held.texts), d)
    if max_tokens is not None:
        train = drop_long(train, tokenizer, max_tokens, f"training prompts of {d.path}")
        held = drop_long(held, tokenizer, max_tokens, f"held-out prompts of {d.eval_path or d.path}")
    return train, held


def prompt_batches(prompts_per_step: int, seed: int, n: int, paired: bool = False):
    """A checkpointable grain iterator of `[prompts_per_step]` int arrays of indices of `n` prompts for this host,
    shuffled per epoch from `seed`; with `paired`, whole pairs `2k, 2k + 1` (a `PromptSet.paired` set's questions
    about one preference)."""
    b = prompts_per_step
    hosts, host = jax.process_count(), jax.process_index()
    unit = 2 if paired else 1
    if b % (hosts * unit):
        raise ConfigError(f"config.rl.prompts_per_step={b} must be divisible by the number of hosts ({hosts})"
                          + (" x 2 (IRPO asks about both responses of a pair in one step)" if paired else ""))
    ds = grain.MapDataset.range(n // unit).shuffle(seed=seed).repeat()
    ds = ds[host::hosts].batch(b // hosts // unit, drop_remainder=True)
    if paired:
        ds = ds.map(lambda k: np.stack([2 * k, 2 * k + 1], axis=1).reshape(-1))
    return iter(ds.to_iter_dataset())
