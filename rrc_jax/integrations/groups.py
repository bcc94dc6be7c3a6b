"""RRC rewards for a trainer that hands its reward function a flat batch: `GroupRewards`, the part of the TRL and
tunix reward functions that knows neither (`rrc_jax.integrations.trl`, `rrc_jax.integrations.tunix`).

A GRPO trainer asks for rewards of `B x G` completions, the G of one prompt side by side (rows `b*G ... b*G + G - 1`:
TRL's `RepeatSampler`, tunix's `np.repeat`). `GroupRewards` cuts them into B groups, checks each is one prompt's,
judges each group whole and returns one float per completion, through the constructions the trainer itself uses:
a kind of the registry (`rrc_jax.constructions.registry.group_kinds`) with its own settings, rewarding the groups by
its `Construction.of_groups`:

* `scr`: win counts of a round robin in the group, alpha x wins (the RRC paper, Eq. 16, Algorithm 1); `cara=True`:
  the group's greedy Kemeny order from those votes, alpha x position (Eq. 19-21); `ordering='merge_sort'` or
  `'knockout'`: an adaptive ordering's;
* `agr`: anchors beaten, alpha x wins (Eq. 22, Algorithm 2): each prompt's anchors (reference responses) come in a
  dataset column (`anchors_column`, a list of n strings per row);
* `prc`: the judge's P(A) against a reference response o_ref (Eq. 5), from a dataset column (`reference_column`);
  it reads next-token log-probs, which only the in-process JAX engine gives;
* `swiss`, `double_elimination`, `circular`, `seeded_knockout` (`seed_by='index'`: the DRM's seeds need this
  trainer): a tournament's standing as rank rewards;
* `active`, `agr_sequential` (with an anchors column): the adaptive schedules, fewer questions at a stated budget
  (`rrc_jax.constructions.adaptive`).

Groups split across processes. TRL gives each process its own slice of the batch, and a slice need not hold whole
groups (its `per_device_train_batch_size x steps_per_generation` need not be a multiple of G). `judge_whole` gathers
the slices (a `Collective`), judges every group once (group g on process g mod P), gathers the rewards and returns
each process its own slice; when every slice holds whole groups it judges locally and moves nothing.

Shapes: B prompts, G completions a prompt, n anchors a prompt, P processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from rrc_jax.constructions.base import step_seed
from rrc_jax.constructions.judged import judge_metrics
from rrc_jax.constructions.registry import construction_class, group_kinds
from rrc_jax.inference import make_sampler
from rrc_jax.judge import Judge, JudgeConfig
from rrc_jax.models import load_hf, load_tokenizer
from rrc_jax.models.hf_io import decoder_config


class Collective(Protocol):
    """The processes a trainer runs on: this one's `rank` of `size`, and `all_gather(items)`, every process's list
    concatenated in rank order (a collective call: every process makes it)."""

    rank: int
    size: int

    def all_gather(self, items: list) -> list: ...


class Alone:
    """The `Collective` of one process."""

    rank, size = 0, 1

    def all_gather(self, items: list) -> list:
        return list(items)


@dataclasses.dataclass(frozen=True)
class Row:
    """One completion to reward: its prompt, its text, and (AGR) its prompt's anchors or (PRC) its reference."""

    prompt: str
    completion: str
    anchors: tuple[str, ...] = ()
    reference: str = ""


def check_groups(rows: Sequence[Row], group_size: int, where: str = "") -> None:
    """A `ValueError` unless `rows` are whole groups of `group_size`, each one prompt's."""
    if len(rows) % group_size:
        raise ValueError(f"{len(rows)} completions{where} are not whole groups of {group_size} (the trainer's "
                         "num_generations): give the reward function group_size = num_generations")
    for g in range(0, len(rows), group_size):
        if len({(r.prompt, r.anchors, r.reference) for r in rows[g:g + group_size]}) != 1:
            raise ValueError(f"completions {g}..{g + group_size - 1}{where} do not share one prompt: the trainer "
                             f"must place the {group_size} completions of a prompt side by side (group_size must "
                             "equal num_generations)")


def judge_whole(rows: Sequence[Row], group_size: int, reward_groups: Callable[[list[Row]], np.ndarray],
                comm: Collective = Alone()) -> np.ndarray:
    """Rewards `[len(rows)]` of this process's `rows`, every group judged whole (the module docstring):
    `reward_groups(rows)` rewards whole groups `[len(rows)]`. Collective when `comm` has several processes."""
    sizes = comm.all_gather([len(rows)]) if comm.size > 1 else [len(rows)]
    if all(n % group_size == 0 for n in sizes):  # every slice holds whole groups: judged where they are
        check_groups(rows, group_size)
        return reward_groups(list(rows)) if rows else np.zeros(0, np.float32)
    every = comm.all_gather(list(rows))
    check_groups(every, group_size, " of the batch gathered from every process")
    mine = [g for g in range(len(every) // group_size) if g % comm.size == comm.rank]
    judged = reward_groups([r for g in mine for r in every[g * group_size:(g + 1) * group_size]]) if mine else []
    rewards = np.zeros(len(every), np.float32)
    for g, values in comm.all_gather([(g, np.asarray(judged[i * group_size:(i + 1) * group_size]).tolist())
                                      for i, g in enumerate(mine)]):
        rewards[g * group_size:(g + 1) * group_size] = values
    start = sum(sizes[:comm.rank])
    return rewards[start:start + len(rows)]


class GroupRewards:
    """RRC rewards of whole groups (the module docstring).

    Args:
      judge: the GRM as a `rrc_jax.judge.Judge` over any Sampler (in process: `make_sampler("grm", model, tok)`;
        a served judge: `inference.engine=openai`); `integrations.judge_for` builds one from a directory.
      kind: one of `group_kinds()` (a reward kind of the registry).
      group_size: G, the trainer's completions per prompt.
      votes, swap: judgments per pair (voting@V) and the A/B swap across them.
      seed: the judge's random stream; call k is reseeded from `seed` and k (or the trainer's step).
      settings: the kind's own (its `Settings`, as `reward.<kind>` in the trainer's config: `alpha`, `ties`, `cara`,
        `think`, `rounds`, ...; the defaults are the trainer's).

    `columns` are the per-prompt inputs the kind reads besides the texts (`Construction.columns`: AGR's `anchors`,
    PRC's `reference`). `last_metrics` holds the last call's `judge/*` metrics (abstain rate, questions, position
    consistency, failed requests of a served judge): log them.
    """

    def __init__(self, judge: Judge, kind: str = "scr", *, group_size: int, votes: int = 1, swap: bool = True,
                 seed: int = 0, **settings):
        if kind not in group_kinds():
            raise ValueError(f"kind={kind!r}: the kinds that reward another trainer's groups are "
                             f"{', '.join(group_kinds())}")
        if group_size < 2:
            raise ValueError(f"group_size={group_size}: a GRPO group needs at least 2 completions")
        if votes < 1:
            raise ValueError(f"votes={votes} must be >= 1")
        cls = construction_class(kind)
        try:
            parsed = cls.Settings(**settings)
        except TypeError:
            known = [f.name for f in dataclasses.fields(cls.Settings)]
            raise ValueError(f"{', '.join(sorted(set(settings) - set(known)))}: not settings of {kind!r} (it has "
                             f"{', '.join(known)})") from None
        self.reward = cls.of_groups(judge, votes=votes, swap=swap, settings=parsed)
        if self.reward is None:
            raise ValueError(f"kind={kind!r} with {settings} rewards inside this trainer only (see the kind's "
                             "settings)")
        self.judge, self.kind, self.columns = judge, kind, cls.columns
        self.group_size, self.votes, self.swap, self.seed, self.calls = group_size, votes, swap, seed, 0
        self.last_metrics: dict[str, float] = {}

    def __call__(self, rows: Sequence[Row], step: int | None = None, *, group_size: int | None = None,
                 seed: int | None = None) -> np.ndarray:
        """Rewards `[len(rows)]` float32 of whole groups (`check_groups`) of `group_size` (default G), the judge
        reseeded from `step` (default: the call's number) as the trainer's constructions are, or with `seed` as
        it is (the caller's own: a reward service's request carries it)."""
        g = self.group_size if group_size is None else group_size
        check_groups(rows, g)
        step = self.calls if step is None else step
        self.calls += 1
        self.judge.reset_metrics()
        self.judge.reseed(step_seed(self.seed, step) if seed is None else seed)
        groups = [rows[i:i + g] for i in range(0, len(rows), g)]
        prompts, responses = [x[0].prompt for x in groups], [[r.completion for r in x] for x in groups]
        result = self.reward(prompts, responses, self._columns(groups))
        self.last_metrics = {**result.metrics, **judge_metrics(self.judge)}
        return np.asarray(result.rewards, np.float32).reshape(-1)

    def _columns(self, groups: list[Sequence[Row]]) -> dict[str, list]:
        """Each group's values of the kind's `columns`, checked."""
        out = {}
        if "anchors" in self.columns:
            anchors = [list(x[0].anchors) for x in groups]
            if not all(anchors) or len({len(a) for a in anchors}) != 1:
                raise ValueError(f"{self.kind} needs each prompt's anchors, the same number for every prompt (a "
                                 "dataset column of lists of reference responses: anchors_column)")
            out["anchors"] = anchors
        if "reference" in self.columns:
            references = [x[0].reference for x in groups]
            if not all(references):
                raise ValueError(f"{self.kind} needs each prompt's reference response o_ref (a dataset column: "
                                 "reference_column)")
            out["reference"] = references
        return out


def text_of(item, what: str = "a completion") -> str:
    """A prompt or completion as text: a string as it is; a conversation (a list of `{"role", "content"}`
    messages, or one message) of one message as its content, a longer one as `role: content` lines. Anything else
    is a `TypeError` naming `what` (e.g. `completion 3`) and the types taken."""
    if isinstance(item, str):
        return item
    messages = [item] if isinstance(item, dict) else list(item) if isinstance(item, (list, tuple)) else None
    if not messages or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        raise TypeError(f"{what} is {type(item).__name__} {str(item)[:80]!r}: the rewards take a string or a "
                        "conversation (a list of {'role': ..., 'content': str} messages)")
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n".join(f"{m.get('role', '')}: {m['content']}" for m in messages)


def rows_of(prompts: Sequence, completions: Sequence, anchors: Sequence | None = None,
            references: Sequence | None = None) -> list[Row]:
    """The `Row`s of a trainer's call (one per completion; `anchors` and `references` a column each, per
    completion, or None). A prompt or completion that is not text is a `TypeError` naming its row (`text_of`)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions (one prompt per completion)")
    return [Row(text_of(p, f"prompt {i}"), text_of(c, f"completion {i}"),
                tuple(map(str, anchors[i])) if anchors is not None else (),
                str(references[i]) if references is not None else "")
            for i, (p, c) in enumerate(zip(prompts, completions))]


def judge_for(model: str, *, url: str = "", template: str = "rrc_pairwise_cot", max_new_tokens: int = 512,
              temperature: float = 1.0, seed: int = 0, max_batch: int = 256, force_verdicts: bool = False,
              **engine_options) -> Judge:
    """The GRM in the Hugging Face directory `model` as a `Judge`: in this process on the JAX engine, or, with
    `url`, asked over HTTP (`inference.engine=openai`: `python -m rrc_jax.serve --model=DIR` or vLLM serving it;
    the directory then needs only its config.json and tokenizer: no weight is read; the server is asked once here
    whether it answers, `OpenAISampler.probe`). `engine_options` go to the HTTP engine (`api_model`,
    `concurrency`, `prompts_per_request`, `timeout_s`, `retries`)."""
    tokenizer = load_tokenizer(model)
    if url and force_verdicts:
        raise ValueError("judge_for: force_verdicts reads the judge's next-token log-probs, which a served judge "
                         "(url) does not return; judge in this process")
    if url:
        sampler = make_sampler("grm", decoder_config(model), tokenizer,
                               engine={"engine": "openai", "url": url, **engine_options})
        sampler.probe()
    else:
        if engine_options:
            raise TypeError(f"judge_for: {', '.join(engine_options)} are options of a served judge (give url=...)")
        sampler = make_sampler("grm", load_hf(model), tokenizer, max_batch=max_batch)
    return Judge(sampler, tokenizer, JudgeConfig(template=template, max_new_tokens=max_new_tokens,
                                                 temperature=temperature, seed=seed, force_verdicts=force_verdicts))
