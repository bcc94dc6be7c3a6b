"""The judge: a generative reward model asked pairwise (and pointwise) questions through a Sampler.

Shapes: B prompts, m responses per prompt, n anchors per prompt, V votes per pair, K pairs, Q judge questions.

Every judgment of a call becomes one *question*: a prompt, the text shown as A, the text shown as B. A question is
rendered with the judge template (`rrc_jax.judge.templates`) into a prefix shared by every question about its prompt
(`[instruction, prompt]`) and its own suffix, tokenized, and handed to the Sampler's `complete` with the others of
the call; reusing the shared prefix is the sampler's business. A question whose tokenization crosses the
prefix / suffix boundary is sent whole (its own prefix) and counted in `reuse_fallbacks`. Verdicts are parsed on
the host and scattered into integer count tensors with `np.add.at`, each question carrying its own prompt index.

Context: no question is judged past the judge model's context (`Judge.context_length`: the sampler's
`context_length` when it says, else its model's `max_position_embeddings`; None: unchecked). A question whose
tokens plus `max_new_tokens` (PRC: plus what is read after its reasoning) do not fit is not sent to the sampler: it
is an abstention (empty text, no verdict, a NaN score, P(A) = 0.5), counted in `abstains` and in `too_long`.

Tracing: while `judge.trace` is a list (the trainer sets one on the steps whose samples it dumps), every judgment
appends one record: `prompt` (the caller's prompt index), the caller's `tags` of its pair or response (e.g. SCR's
`i`, `j`; AGR's `i`, `anchor`), and the judgment's `text` with what was read from it (`vote`, `swapped`, `verdict`
as shown and `winner` in the caller's order for pairwise votes; `p_a` for PRC; `score` for pointwise questions);
an over-long question's record also says `too_long: True`.

Forced verdicts (`JudgeConfig.force_verdicts`, off by default; a small judge that writes prose and no `[[A]]`): a
pairwise judgment that ends without a verdict is read once more with the template's `verdict_prefix` appended, and
its verdict is the likelier of the "A" and "B" tokens at the next position (`verdict_token_ids`), counted in
`forced_verdicts` (its trace record says `forced: True`). Only a question too long for that read stays an
abstention. The read needs the next token's log-probs: an in-process judge.

A/B swapping (beyond the paper, against position bias): with `swap=True` the V votes of a pair alternate between
the two orders. Which order vote 0 uses alternates across pairs (`orders`): for SCR by the parity of
`b + i + j`, for AGR of `b + i + k`. With odd V one order gets the extra vote, and this choice keeps it from
favouring a response index: under a judge that always answers "A", every response of an odd-sized group gets the
same SCR win count, every response gets the same AGR anchor count when n is even, and otherwise every response
index gets the same mean reward over each two consecutive prompts.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np

from rrc_jax import distributed
from rrc_jax.errors import ConfigError
from rrc_jax.inference.question_tree import common_length
from rrc_jax.inference.sampler import Sampler, SamplingParams
from rrc_jax.judge.templates import (JudgeTemplate, direct_template, encode_question, encode_text, first_segment,
                                     get_template, render_parts)
from rrc_jax.judge.verdicts import parse_score, parse_verdict
from rrc_jax.rewards._checks import check_votes
from rrc_jax.rewards.win_counts import votes_to_decide
from rrc_jax.settings import not_in_config

_VERDICT = re.compile(r"\[\[\s*[AaBb]\s*\]\]")


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    """How the judge asks: the one description every caller builds (the trainer's `reward.judge` group is a
    `JudgeSettings`, a reward-model recipe's `judge` group an `RMJudgeConfig`, both subclasses with their own
    defaults; `evaluate_rm`, `judge` and `integrations.judge_for` make one from their arguments). `template`: a
    name, a `.json` / `.yaml` file or a `JudgeTemplate`; `direct_template` (PRC without thinking) defaults to the
    template's own direct variant. `temperature=0` is greedy; `max_new_tokens` bounds the reasoning plus the verdict
    (a judgment cut off before its verdict abstains, unless `force_verdicts` reads one: the module docstring).
    `seed` starts the stream of its draws (a run's judge: the run's seed, reseeded every step); neither it nor
    `direct_template` is a config field."""

    template: str | JudgeTemplate = "rrc_pairwise_cot"
    direct_template: str | JudgeTemplate | None = not_in_config(None)
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    force_verdicts: bool = False
    seed: int = not_in_config(0)

    def __post_init__(self):
        try:  # SamplingParams validates the sampling fields now, not at the first question
            _ = self.sampling
        except ValueError as e:  # a config group's settings (a subclass's GROUP) are the user's to fix
            if not hasattr(self, "GROUP"):
                raise
            raise ConfigError(f"config.{self.GROUP}: {e}") from None

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, max_new_tokens=self.max_new_tokens)


@dataclasses.dataclass
class JudgeMetrics:
    """Counters accumulated over a `Judge`'s calls (`Judge.metrics`, `Judge.reset_metrics()`)."""

    questions: int = 0            # judge questions asked (one generation each; PRC without thinking: one read)
    judge_tokens: int = 0         # tokens generated by the judge
    reuse_fallbacks: int = 0      # questions whose tokenization split badly at the prefix: sent whole
    abstains: int = 0             # unparseable verdicts / scores, and questions too long for the context
    too_long: int = 0             # questions that do not fit the judge's context: not asked, abstentions
    truncated: int = 0            # judgments cut off at max_new_tokens
    swap_couples: int = 0         # (original, swapped) vote couples where both verdicts parsed
    swap_consistent: int = 0      # ... and agreed once the swapped one was flipped back
    forced_verdicts: int = 0      # no verdict in the judgment: the verdict prefix appended and read (module docstring)
    vote_rounds: int = 0          # early-stopped voting: rounds asked (0: every vote asked at once)
    votes_skipped: int = 0        # ... and votes not asked, their pair's outcome already decided
    seconds: float = 0.0


class Questions(NamedTuple):
    """A call's Q questions as the sampler takes them: `prefixes` (prompt i's shared `[instruction, prompt]` is
    prefix i; a question whose tokens do not split there has its whole text as a prefix of its own, after them),
    `suffixes [Q]` `(prefix index, suffix ids)`, `splits [Q]` (the suffix's leading tokens up to the end of its first
    response, which the questions showing that response first share: `templates.first_segment`; 0 when the tokens
    do not split there) and `too_long [Q]` bool: the question and the tokens to be written after it do not fit the
    judge's context (never sent to the sampler)."""

    prefixes: list[list[int]]
    suffixes: list[tuple[int, list[int]]]
    splits: list[int]
    too_long: np.ndarray


def sampler_context_length(sampler) -> int | None:
    """The most tokens (question plus continuation) `sampler`'s model holds: its `context_length` attribute when it
    has one, else its model's `cfg.max_position_embeddings` (a `JaxSampler`'s `Decoder`); None when it says
    neither (questions are then not checked)."""
    n = getattr(sampler, "context_length", None)
    if n is None:
        n = getattr(getattr(getattr(sampler, "model", None), "cfg", None), "max_position_embeddings", None)
    return None if n is None else int(n)


def _too_long_mark(too_long: bool) -> dict:
    """What a trace record adds for an over-long question."""
    return {"too_long": True} if too_long else {}


class PairVotes(NamedTuple):
    """Votes per pair `[K]` int32: `wins` for the first text, `losses` for the second, `abstains`."""

    wins: np.ndarray
    losses: np.ndarray
    abstains: np.ndarray


class Vote(NamedTuple):
    """One judgment: pair index, vote index, whether A/B were swapped, the judge's text, its parsed verdict
    ('A' | 'B' | None, as shown) and the winner mapped back to the caller's order ('a' | 'b' | None)."""

    pair: int
    vote: int
    swapped: bool
    text: str
    verdict: str | None
    winner: str | None


def check_groups(responses, name: str) -> int:
    """The common size of the groups `responses [B][m]` (0 for no groups: a host without prompts of its own); a
    ValueError when they differ."""
    sizes = {len(g) for g in responses}
    if not sizes:
        return 0
    if len(sizes) != 1:
        raise ValueError(f"{name}: every prompt needs the same number of texts, got sizes {sorted(sizes)}; "
                         "pad the groups or judge them in separate calls")
    return sizes.pop()


class Judge:
    """A generative reward model that answers pairwise (and pointwise) questions in batches.

    Args:
      sampler: a `rrc_jax.inference.Sampler` over the judge model (e.g. `make_sampler("grm", grm, tokenizer)`).
      tokenizer: the judge model's Hugging Face tokenizer (its chat template is used when present).
      config: `JudgeConfig`; keyword overrides are applied on top (`Judge(s, tok, temperature=0)`).
    """

    def __init__(self, sampler: Sampler, tokenizer, config: JudgeConfig | None = None, **overrides):
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.config = dataclasses.replace(config or JudgeConfig(), **overrides)
        self.template = get_template(self.config.template)
        self._direct = self.config.direct_template
        self.metrics = JudgeMetrics()
        self.trace: list[dict] | None = None  # a list: every judgment is recorded there (module docstring)
        self.context_length = sampler_context_length(sampler)  # None: questions are not checked (module docstring)
        self._calls = 0

    @property
    def direct_template(self) -> JudgeTemplate:
        """The template of PRC without thinking: `config.direct_template`, else the template's direct variant."""
        return get_template(self._direct) if self._direct is not None else direct_template(self.template)

    def reset_metrics(self) -> None:
        self.metrics = JudgeMetrics()
        self.sampler.stats.reset()

    def summary(self) -> dict[str, float]:
        """The counters, the sampler's (`sampler_calls`, `prefill_tokens`, `prefill_tokens_saved`, `decode_row_steps`,
        `decoded_tokens`: `SamplerStats`; from an engine
        over a network, its `requests`, the `failed_requests` left unanswered and so abstentions, and those by kind:
        `openai_engine.HttpStats`), and the rates `abstain_rate` and `position_consistency` (NaN when undefined)."""
        m, s = self.metrics, self.sampler.stats
        out = dataclasses.asdict(m)
        out.update(sampler_calls=s.calls, prefill_tokens=s.prefill_tokens, prefill_tokens_saved=s.prefill_tokens_saved,
                   decode_row_steps=s.decode_row_steps, decoded_tokens=s.generated_tokens, **s.failures())
        out["abstain_rate"] = m.abstains / m.questions if m.questions else float("nan")
        out["position_consistency"] = m.swap_consistent / m.swap_couples if m.swap_couples else float("nan")
        return out

    def reseed(self, seed: int) -> None:
        """Restart the judge's random stream from `seed`: a trainer reseeds it every step (e.g. from the step
        number), so that a resumed run draws the same judgments as an uninterrupted one."""
        self.config = dataclasses.replace(self.config, seed=int(seed))
        self._calls = 0

    # -- low level: questions -> the sampler ------------------------------------------------------------

    def _record(self, owners: Sequence[int], tags: Sequence[dict] | None, rows: Sequence[dict]) -> None:
        """Append one trace record per judgment (`rows[q]`, about prompt `owners[q]`, with `tags[q]`) when
        tracing."""
        if self.trace is not None:
            self.trace.extend({"prompt": int(o), **(tags[q] if tags is not None else {}), **row}
                              for q, (o, row) in enumerate(zip(owners, rows)))

    def _next_key(self) -> jax.Array:
        self._calls += 1
        return jax.random.fold_in(jax.random.key(self.config.seed), self._calls)

    def _too_long(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[tuple[int, Sequence[int]]],
                  new_tokens: int) -> np.ndarray:
        """`[Q]` bool: the questions whose tokens plus `new_tokens` exceed `context_length` (all False when it is
        None)."""
        if self.context_length is None:
            return np.zeros(len(suffixes), bool)
        return np.array([len(prefixes[o]) + len(s) + new_tokens > self.context_length for o, s in suffixes], bool)

    def _questions(self, template: JudgeTemplate, prompts: Sequence[str], owners: Sequence[int],
                   items: Sequence[dict[str, str]], new_tokens: int) -> Questions:
        """The `Questions` of a call, those that leave no room for `new_tokens` more counted in `too_long`: prompt
        i's `[instruction, prompt]` prefix is prefix i; a question whose tokens do not split at the prefix gets its
        whole text as a prefix of its own."""
        prefix_ids: dict[int, list[int]] = {}
        lead_ids: dict[str, list[int]] = {}
        extra: list[list[int]] = []
        suffixes, splits = [], []
        for owner, item in zip(owners, items):
            owner = int(owner)
            pre, suf = render_parts(self.tokenizer, template, prompts[owner], **item)
            if owner not in prefix_ids:
                prefix_ids[owner] = encode_text(self.tokenizer, pre, first=True)
            q = encode_question(self.tokenizer, pre, suf, prefix_ids[owner])
            if q.reusable:
                suffixes.append((owner, q.suffix))
                lead = first_segment(template, **item)
                lead = lead if suf.startswith(lead) else ""
                if lead not in lead_ids:
                    lead_ids[lead] = encode_text(self.tokenizer, lead, first=False) if lead else []
                splits.append(common_length(lead_ids[lead], q.suffix))  # (a token merged across the end: one less)
            else:
                self.metrics.reuse_fallbacks += 1
                suffixes.append((len(prompts) + len(extra), []))
                splits.append(0)
                extra.append(q.full)
        prefixes = [prefix_ids.get(i, []) for i in range(len(prompts))] + extra
        too_long = self._too_long(prefixes, suffixes, new_tokens)
        self.metrics.too_long += int(too_long.sum())
        return Questions(prefixes, suffixes, splits, too_long)

    def _complete(self, template: JudgeTemplate, prompts: Sequence[str], owners: Sequence[int],
                  items: Sequence[dict[str, str]], streams: Sequence[int] | None = None, key: jax.Array | None = None
                  ) -> tuple[list[str], Questions]:
        """One judgment per question, question q drawing from stream `streams[q]` (default q) of `key` (default: the
        judge's next): (texts, the questions). An over-long question is not sent to the sampler; its text is ""."""
        t0 = time.perf_counter()
        questions = self._questions(template, prompts, owners, items, self.config.max_new_tokens)
        asked = np.flatnonzero(~questions.too_long)
        streams = np.arange(len(items)) if streams is None else np.asarray(streams, np.int64)
        out = self.sampler.complete(questions.prefixes, [questions.suffixes[q] for q in asked], self.config.sampling,
                                    rng=self._next_key() if key is None else key, streams=streams[asked],
                                    splits=[questions.splits[q] for q in asked])  # with none: still collective
        texts = [""] * len(questions.suffixes)
        for q, tokens, n, cut in zip(asked, out.tokens, out.lengths, out.truncated):
            n = int(n) - (0 if cut or n == 0 else 1)  # a finished row ends with its stop token; an unanswered is empty
            texts[q] = self.tokenizer.decode(tokens[:n].tolist(), skip_special_tokens=True)
        self.metrics.questions += len(questions.suffixes)
        self.metrics.judge_tokens += int(out.lengths.sum())
        self.metrics.truncated += int(out.truncated.sum())
        self.metrics.seconds += time.perf_counter() - t0
        return texts, questions

    # -- pairwise votes --------------------------------------------------------------------------------

    def pair_votes(self, prompts: Sequence[str], owners: Sequence[int], firsts: Sequence[str],
                   seconds: Sequence[str], votes: int, swap: bool, orders: Sequence[int] | None = None,
                   tags: Sequence[dict] | None = None, outcome=None) -> tuple[PairVotes, list[Vote]]:
        """Votes `[K]` for K pairs (prompt `owners[k]`, `firsts[k]` vs `seconds[k]`), each asked `votes` times.

        With `swap`, vote v of pair k shows it reversed iff `v + orders[k]` is odd (default `orders[k] = k % 2`);
        without, never. `tags[k]`: what a trace record of pair k says about it (default `{"pair": k}`).

        Vote v of pair k draws from stream `k * votes + v` of the call's key. With `outcome` (what of a pair's
        margin `wins - losses` the caller reads: `rrc_jax.rewards.win_counts.pair_outcome`) the votes are asked in
        rounds, in order v = 0, 1, ...: each round asks an undecided pair as many more votes as could decide it
        (`votes_to_decide`), and a pair stops once the votes left cannot change its outcome. Every vote asked is
        the one full voting asks (its stream), so every outcome is full voting's; the counts of a stopped pair are
        smaller, and the votes not asked are `metrics.votes_skipped`."""
        template = self.template
        if template.kind != "pairwise":
            raise ValueError(f"judge template {template.name!r} is {template.kind}; pairwise questions need a "
                             "pairwise template (e.g. 'rrc_pairwise_cot')")
        k = len(firsts)
        orders = [p % 2 for p in range(k)] if orders is None else [int(o) for o in orders]
        key = self._next_key()  # one key for every round: a vote's draws are its stream's
        wins, losses, abstains = (np.zeros(k, np.int32) for _ in range(3))
        asked = np.zeros(k, np.int64)
        want = np.full(k, votes, np.int64) if outcome is None else votes_to_decide(wins, losses, asked + votes,
                                                                                   outcome)
        # (pair, vote, swapped, text, verdict, first wins, too long, forced) of every vote asked
        ballots: list[tuple] = []
        while True:
            todo = [(p, v) for p in range(k) for v in range(asked[p], asked[p] + want[p])]
            swapped = [swap and (v + orders[p]) % 2 == 1 for p, v in todo]
            items = [{"a": seconds[p], "b": firsts[p]} if s else {"a": firsts[p], "b": seconds[p]}
                     for (p, _), s in zip(todo, swapped)]
            texts, questions = self._complete(template, prompts, [owners[p] for p, _ in todo], items,
                                              streams=[p * votes + v for p, v in todo], key=key)
            verdicts = [None if long else parse_verdict(t) for t, long in zip(texts, questions.too_long)]
            forced = self._forced(template, questions, texts, verdicts) if self.config.force_verdicts else set()
            for q, ((p, v), s, t, long) in enumerate(zip(todo, swapped, texts, questions.too_long)):
                verdict = verdicts[q]
                first = (verdict == "B") if s else (verdict == "A")
                ballots.append((p, v, s, t, verdict, first, bool(long), q in forced))
                counter = abstains if verdict is None else (wins if first else losses)
                counter[p] += 1
            asked += want
            if outcome is None:
                break
            self.metrics.vote_rounds += 1
            want = votes_to_decide(wins, losses, votes - asked, outcome)
            if not distributed.any_host(bool(want.any())):  # every host asks as many rounds (collective calls)
                break
        self.metrics.votes_skipped += int(k * votes - asked.sum())
        self.metrics.abstains += int(abstains.sum())
        ballots.sort(key=lambda x: (x[0], x[1]))  # full voting's order
        self._swap_couples(ballots)
        log = [Vote(p, v, s, t, verdict, None if verdict is None else ("a" if first else "b"))
               for p, v, s, t, verdict, first, *_ in ballots]
        tags = [{"pair": p} for p in range(k)] if tags is None else tags
        self._record([owners[x.pair] for x in log], [tags[x.pair] for x in log], [
            {"vote": x.vote, "swapped": x.swapped, "text": x.text, "verdict": x.verdict, "winner": x.winner}
            | _too_long_mark(b[6]) | ({"forced": True} if b[7] else {}) for x, b in zip(log, ballots)])
        return PairVotes(wins, losses, abstains), log

    def _forced(self, template: JudgeTemplate, questions: Questions, texts: Sequence[str],
                verdicts: list[str | None]) -> set[int]:
        """Read a verdict where a judgment wrote none (module docstring, "Forced verdicts"): `verdicts` filled in
        place; returns the questions forced. Every host reads (a collective call), with or without questions."""
        token_a, token_b = self.verdict_token_ids(template.verdict_prefix)
        todo = [q for q, (v, long) in enumerate(zip(verdicts, questions.too_long)) if v is None and not long]
        reads = [(questions.suffixes[q][0], list(questions.suffixes[q][1]) + encode_text(
            self.tokenizer, texts[q].rstrip() + "\n" + template.verdict_prefix, first=False)) for q in todo]
        fits = ~self._too_long(questions.prefixes, reads, 1)
        todo, reads = [q for q, ok in zip(todo, fits) if ok], [r for r, ok in zip(reads, fits) if ok]
        t0 = time.perf_counter()
        logp = self.sampler.next_token_logprobs(questions.prefixes, reads, [token_a, token_b],
                                                splits=[questions.splits[q] for q in todo])
        self.metrics.seconds += time.perf_counter() - t0
        for q, (a, b) in zip(todo, np.asarray(logp).reshape(len(todo), 2)):
            verdicts[q] = "A" if a >= b else "B"
        self.metrics.forced_verdicts += len(todo)
        return set(todo)

    def _swap_couples(self, ballots: list[tuple]) -> None:
        """Count the couples (vote 2t, vote 2t + 1) of a pair, one in each order, both asked and parsed, and
        those that agree once the swapped one is flipped back (`position_consistency`)."""
        by_vote = {(p, v): (s, verdict, first) for p, v, s, _, verdict, first, *_ in ballots}
        for (p, v), (s, verdict, first) in by_vote.items():
            other = by_vote.get((p, v + 1)) if v % 2 == 0 else None
            if other is None or other[0] == s or verdict is None or other[1] is None:
                continue
            self.metrics.swap_couples += 1
            self.metrics.swap_consistent += int(first == other[2])

    def compare(self, prompts: Sequence[str], a: Sequence[str], b: Sequence[str], votes: int = 1,
                swap: bool = True) -> PairVotes:
        """Judge K pairs (`prompts[k]`, `a[k]` vs `b[k]`) `votes` times each; identical prompt strings share one
        prefix. Returns `PairVotes` of `[K]` int32: wins (for a), losses (for b), abstains."""
        return self.explain(prompts, a, b, votes, swap)[0]

    def explain(self, prompts: Sequence[str], a: Sequence[str], b: Sequence[str], votes: int = 1,
                swap: bool = True) -> tuple[PairVotes, list[Vote]]:
        """`compare` plus every judgment (`Vote`: text, verdict as shown, winner in the caller's order)."""
        check_votes(votes)
        if not len(prompts) == len(a) == len(b):
            raise ValueError(f"compare: prompts, a and b must have equal lengths, got {len(prompts)}, {len(a)}, "
                             f"{len(b)}")
        unique = list(dict.fromkeys(prompts))
        index = {p: i for i, p in enumerate(unique)}
        return self.pair_votes(unique, [index[p] for p in prompts], a, b, votes, swap)

    def round_robin(self, prompts: Sequence[str], responses: Sequence[Sequence[str]], votes: int = 1,
                    swap: bool = True, outcome=None) -> np.ndarray:
        """SCR vote counts `c [B, m, m]` int32: `c[b, i, j]` = votes preferring response i over j. Each unordered
        pair i < j is asked `votes` times (m(m-1)/2 x V questions per prompt); vote 0 shows it as (i, j) when
        `b + i + j` is even (see the module docstring). `outcome`: stop a pair's votes once it is decided
        (`pair_votes`)."""
        check_votes(votes)
        if len(prompts) != len(responses):
            raise ValueError(f"round_robin: {len(prompts)} prompts but {len(responses)} response groups")
        m = check_groups(responses, "round_robin responses")
        pairs = [(g, i, j) for g in range(len(prompts)) for i in range(m) for j in range(i + 1, m)]
        c = np.zeros((len(prompts), m, m), np.int32)
        g, i, j = (np.array(x, np.int64) for x in zip(*pairs)) if pairs else (np.zeros(0, np.int64),) * 3
        pv, _ = self.pair_votes(prompts, g, [responses[x][y] for x, y in zip(g, i)],
                                [responses[x][y] for x, y in zip(g, j)], votes, swap, orders=(g + i + j) % 2,
                                tags=[{"i": int(x), "j": int(y)} for x, y in zip(i, j)], outcome=outcome)
        np.add.at(c, (g, i, j), pv.wins)
        np.add.at(c, (g, j, i), pv.losses)
        return c

    def vs_anchors(self, prompts: Sequence[str], responses: Sequence[Sequence[str]],
                   anchors: Sequence[Sequence[str]], votes: int = 1, swap: bool = True, outcome=None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """AGR votes `wins, losses [B, m, n]` int32 of each response against each anchor of its own prompt
        (m x n x V questions per prompt). Vote 0 shows the response as A when `b + i + k` is even. `outcome`: stop
        a pair's votes once it is decided (`pair_votes`)."""
        check_votes(votes)
        if not len(prompts) == len(responses) == len(anchors):
            raise ValueError(f"vs_anchors: {len(prompts)} prompts, {len(responses)} response groups and "
                             f"{len(anchors)} anchor groups must match")
        m = check_groups(responses, "vs_anchors responses")
        n = check_groups(anchors, "vs_anchors anchors")
        g, i, k = (x.ravel() for x in np.meshgrid(np.arange(len(prompts)), np.arange(m), np.arange(n),
                                                    indexing="ij"))
        pv, _ = self.pair_votes(prompts, g, [responses[x][y] for x, y in zip(g, i)],
                                [anchors[x][y] for x, y in zip(g, k)], votes, swap, orders=(g + i + k) % 2,
                                tags=[{"i": int(x), "anchor": int(y)} for x, y in zip(i, k)], outcome=outcome)
        shape = (len(prompts), m, n)
        return pv.wins.reshape(shape), pv.losses.reshape(shape)

    # -- PRC -------------------------------------------------------------------------------------------

    def verdict_token_ids(self, verdict_prefix: str = "[[") -> tuple[int, int]:
        """Ids of the tokens "A" and "B" as written right after `verdict_prefix`: the ids of `prefix + letter`
        must be the ids of `prefix` plus exactly one token (true for character, SentencePiece and byte-level BPE
        vocabularies that have "[[" or "[" tokens); otherwise a ValueError."""
        base = encode_text(self.tokenizer, verdict_prefix, first=False)
        out = []
        for letter in "AB":
            ids = encode_text(self.tokenizer, verdict_prefix + letter, first=False)
            if len(ids) != len(base) + 1 or ids[:len(base)] != base:
                raise ValueError(f"the tokenizer does not write verdict {letter!r} as one token after "
                                 f"{verdict_prefix!r}; use a template whose verdict_prefix ends at a token boundary")
            out.append(ids[-1])
        return out[0], out[1]

    def preference_prob(self, prompts: Sequence[str], a: Sequence[str], b: Sequence[str], think: bool = True,
                        tags: Sequence[dict] | None = None) -> np.ndarray:
        """P(A) `[K]` float32 for K pairs, read at the verdict position (PRC, Eq. 5: `a` is the candidate o, `b` the
        reference o_ref).

        think=True: the judge (config `template`) first writes its reasoning; the text up to its final verdict
        (the last `[[X]]`; when there is none, the whole reasoning followed by the template's `verdict_prefix`,
        counted as `forced_verdicts`) ending in "[[" is read once more, and P(A) is the softmax over the
        log-probabilities of the "A" and "B" tokens (`verdict_token_ids`) at the next position.
        think=False: the same read directly after the prompt of `direct_template` plus its `verdict_prefix`.
        A question that does not fit the judge's context (with its reasoning, or with what is read) is 0.5, an
        abstention counted in `too_long` (module docstring).
        The reasoning is re-tokenized from its text. `tags[k]`: what a trace record of pair k says about it."""
        if not len(prompts) == len(a) == len(b):
            raise ValueError(f"preference_prob: prompts, a and b must have equal lengths, got {len(prompts)}, "
                             f"{len(a)}, {len(b)}")
        template = self.template if think else self.direct_template
        if template.kind != "pairwise":
            raise ValueError(f"preference_prob needs a pairwise template, got {template.name!r}")
        unique = list(dict.fromkeys(prompts))
        index = {p: i for i, p in enumerate(unique)}
        owners = [index[p] for p in prompts]
        items = [{"a": x, "b": y} for x, y in zip(a, b)]
        token_a, token_b = self.verdict_token_ids("[[")
        if think:
            texts, questions = self._complete(template, unique, owners, items)
        else:
            questions = self._questions(template, unique, owners, items, 1)  # room for the verdict letter at least
            texts = [None] * len(questions.suffixes)
            self.metrics.questions += len(questions.suffixes)  # asked too, read without a judgment
        t0 = time.perf_counter()
        read = []
        for (owner, suffix), text, long in zip(questions.suffixes, texts, questions.too_long):
            if long:
                read.append((owner, []))  # not read
                continue
            if text is None:
                tail = template.verdict_prefix
            else:
                hits = list(_VERDICT.finditer(text))
                if hits:
                    tail = text[:hits[-1].start()] + "[["
                else:
                    self.metrics.forced_verdicts += 1
                    tail = text.rstrip() + "\n" + template.verdict_prefix
            if not tail.endswith("[["):
                raise ValueError(f"template {template.name!r}: verdict_prefix must end with '[['")
            read.append((owner, list(suffix) + encode_text(self.tokenizer, tail, first=False)))
        over = self._too_long(questions.prefixes, read, 1) & ~questions.too_long  # the reasoning re-tokenized longer
        self.metrics.too_long += int(over.sum())
        skipped = questions.too_long | over
        self.metrics.abstains += int(skipped.sum())
        asked = np.flatnonzero(~skipped)
        logp = self.sampler.next_token_logprobs(questions.prefixes, [read[q] for q in asked], [token_a, token_b],
                                                splits=[questions.splits[q] for q in asked])
        self.metrics.seconds += time.perf_counter() - t0
        p_a = np.full(len(read), 0.5, np.float32)  # an over-long question: no preference
        p_a[asked] = 1.0 / (1.0 + np.exp(logp[:, 1] - logp[:, 0]))  # softmax over {A, B}
        self._record(owners, tags, [{"text": t, "p_a": float(p)} | _too_long_mark(x)
                                    for t, p, x in zip(texts, p_a, skipped)])
        return p_a

    # -- pointwise (IRPO) --------------------------------------------------------------------------------

    def score(self, prompts: Sequence[str], responses: Sequence[Sequence[str]], template="irpo_pointwise",
              tags: Sequence[dict] | None = None) -> np.ndarray:
        """Pointwise scores `[B, m]` float32 (NaN where unparseable, counted as abstains) with a pointwise
        template (default IRPO Appendix A). `tags[b * m + i]`: what a trace record of response i of prompt b says
        about it (default `{"i": i}`)."""
        template = get_template(template)
        if template.kind != "pointwise":
            raise ValueError(f"score() needs a pointwise template, got {template.name!r} ({template.kind})")
        m = check_groups(responses, "score responses")
        owners = [g for g in range(len(prompts)) for _ in range(m)]
        items = [{"response": r} for g in responses for r in g]
        texts, questions = self._complete(template, prompts, owners, items)
        scores = [None if long else parse_score(t) for t, long in zip(texts, questions.too_long)]
        self.metrics.abstains += sum(s is None for s in scores)
        self._record(owners, [{"i": q % m} for q in range(len(texts))] if tags is None else tags,
                     [{"text": t, "score": s} | _too_long_mark(long)
                      for t, s, long in zip(texts, scores, questions.too_long)])
        return np.array([math.nan if s is None else s for s in scores], np.float32).reshape(len(prompts), m)
