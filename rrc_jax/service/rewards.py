"""The reward service's judge: a cohort's rewards from a construction of the registry (`GroupRewards`: SCR's win
counts, CARA, AGR's anchors beaten, PRC, a tournament's standing) and its judge, the cohorts of one call judged in
as few construction calls as their sizes allow (whole cohorts share one; an expired cohort of k < G rollouts is
judged as a group of k).

A construction that reads a prompt's columns gets them from the request (a rollout's `anchors`: a trainer that
samples its own, `rrc_jax.constructions.served`) or from the service: AGR's anchors (`anchors`: prompt -> its
reference responses) and PRC's reference (`references`: prompt -> o_ref). A prompt without them fails its cohort
with an error naming it.

`recipe_app(s)` is the service of a recipe (a trainer config): what `python -m rrc_jax.service` serves.

Shapes: C cohorts a call, k rollouts a cohort.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from rrc_jax.constructions.served import recipe
from rrc_jax.errors import ConfigError
from rrc_jax.inference.openai_engine import failure_text
from rrc_jax.inference.sampler import SampleOutput, SamplingParams
from rrc_jax.integrations.groups import GroupRewards, Row, judge_for
from rrc_jax.progress import say
from rrc_jax.rl.roles import Roles
from rrc_jax.service.cohorts import Answer, Cohort, Rollout


class Remembered:
    """A greedy judge's sampler that remembers its judgments: `complete` at temperature 0 asks the engine only the
    questions (token ids, sampling settings) it has not answered before, the rest from memory (the last `capacity`
    questions). A reward service asks an unfinished cohort's questions while the judge is idle (SCR: the pairs of
    the rollouts in so far) and the whole cohort's later; the questions asked already then cost nothing, and the
    judgments are the ones a greedy engine gives every time. At temperature > 0 it asks everything (a question's
    draw depends on its call's key and stream). Only answers are remembered: a question whose request failed (the
    engine's `last_failed`) is asked again next time. `hits` counts the questions answered from memory."""

    def __init__(self, sampler, capacity: int = 200_000):
        self.inner, self.capacity, self.hits = sampler, capacity, 0
        self._rows: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()

    def __getattr__(self, name):  # the rest of the Sampler protocol: the engine's
        return getattr(self.inner, name)

    def complete(self, prefixes, suffixes, params: SamplingParams = SamplingParams(), rng=0, *, streams=None,
                 splits=None) -> SampleOutput:
        if params.temperature != 0:
            return self.inner.complete(prefixes, suffixes, params, rng, streams=streams, splits=splits)
        keys = [(params, *map(int, prefixes[p]), -1, *map(int, s)) for p, s in suffixes]
        firsts = {k: q for q, k in reversed(list(enumerate(keys)))}  # each different question's first asking
        ask = [firsts[k] for k in dict.fromkeys(keys) if k not in self._rows]
        if ask:
            used = sorted({suffixes[q][0] for q in ask})
            where = {p: i for i, p in enumerate(used)}
            out = self.inner.complete([prefixes[p] for p in used],
                                      [(where[suffixes[q][0]], suffixes[q][1]) for q in ask], params, rng,
                                      streams=[streams[q] if streams is not None else q for q in ask],
                                      splits=[splits[q] for q in ask] if splits is not None else None)
        failed = getattr(self.inner, "last_failed", None)  # (a served engine's unanswered questions)
        fresh = {}
        for j, q in enumerate(ask):
            fresh[keys[q]] = tuple(x[j] for x in out)
            if failed is None or not failed[j]:  # an answer is remembered; a failed request's empty row is not
                self._rows[keys[q]] = fresh[keys[q]]
        self.hits += len(keys) - len(ask)
        rows = [fresh.get(k) or self._rows[k] for k in keys]
        for k in keys:
            if k in self._rows:
                self._rows.move_to_end(k)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)
        return SampleOutput(*(np.stack([row[f] for row in rows]) for f in range(4)))


def cohort_rewards(rewards: GroupRewards, *, anchors: Mapping[str, Sequence[str]] | None = None,
                   references: Mapping[str, str] | None = None, max_failed_fraction: float = 1.0):
    """`reward_cohorts(cohorts) -> answers` (`rrc_jax.service.app.RewardCohorts`) over `rewards`.

    One construction call judges the cohorts of one size and one seed (a request's groups, `Cohort.seed`, in the
    order they were counted, the judge seeded with it: the same request gets the same rewards whatever else the
    service judges, before or after a restart); the unseeded cohorts of one size share a call on the service's own
    stream. A cohort's own fault (a prompt without anchors, a text the judge cannot take) fails it alone, its cause
    named; a call whose judge requests failed beyond `max_failed_fraction` (a judge pool's servers down) fails its
    cohorts, naming the failures, rather than answering the abstentions' zeros as rewards."""
    anchors, references = anchors or {}, references or {}

    def row(r: Rollout) -> Row:
        given = r.anchors or tuple(anchors.get(r.prompt, ()))
        if "anchors" in rewards.columns and not given:
            raise KeyError(f"no anchors for prompt {r.prompt[:80]!a}: {rewards.kind} needs each prompt's anchors")
        if "reference" in rewards.columns and not references.get(r.prompt):
            raise KeyError(f"no reference for prompt {r.prompt[:80]!a}: {rewards.kind} needs each prompt's o_ref")
        return Row(r.prompt, r.completion, given, references.get(r.prompt, ""))

    def judged(cohorts: list[Cohort], k: int, seed: int | None) -> list[list[Answer]]:
        """The answers of `cohorts` (each of k rollouts) judged in one call, or each alone when that call raises."""
        try:
            values = rewards([row(r) for c in cohorts for r in c.rollouts], group_size=k, seed=seed)
        except Exception as e:  # noqa: BLE001 - the cause is the cohort's answer
            if len(cohorts) > 1:
                return [a for c in cohorts for a in judged([c], k, seed)]
            cause = e.args[0] if isinstance(e, KeyError) and e.args else f"{type(e).__name__}: {e}"
            return [[Answer(error=f"group {cohorts[0].key[:80]!a}: {cause}")] * k]
        metrics = dict(rewards.last_metrics)
        asked, failed = metrics.get("judge/requests", 0), metrics.get("judge/failed_requests", 0)
        if asked and failed / asked > max_failed_fraction:
            counts = {k[len("judge/"):]: v for k, v in metrics.items() if k.startswith("judge/")}
            error = (f"the judge failed {int(failed)} of {int(asked)} requests ({failure_text(counts)}), more than "
                     f"the service's --max_failed_fraction={max_failed_fraction:g}: its servers are down or failing")
            return [[Answer(error=error, metrics=metrics)] * k for _ in cohorts]
        return [[Answer(reward=float(v), metrics=metrics) for v in values[j * k:(j + 1) * k]]
                for j in range(len(cohorts))]

    def reward_cohorts(cohorts: list[Cohort]) -> list[list[Answer]]:
        calls: dict[tuple, list[int]] = {}
        for i, c in enumerate(cohorts):
            calls.setdefault((len(c.rollouts), c.seed), []).append(i)
        answers: list[list[Answer]] = [[] for _ in cohorts]
        for (k, seed), members in calls.items():
            members.sort(key=lambda i: cohorts[i].serial)
            for i, answer in zip(members, judged([cohorts[i] for i in members], k, seed)):
                answers[i] = answer
        return answers

    return reward_cohorts


def read_columns(path: str, kind: str, columns: tuple[str, ...]) -> dict:
    """`cohort_rewards`' keyword arguments from the `--anchors` file at `path`, for a kind reading `columns` (a
    one-line `ConfigError` naming the flag)."""
    def refuse(message: str) -> ConfigError:
        return ConfigError(f"--anchors={path}: {message}")

    if not columns:
        if path:
            raise refuse(f"reward.kind={kind} reads no anchors or references; drop the flag")
        return {}
    if not path:
        if columns == ("anchors",):  # then each request brings its prompts' anchors (a trainer's own samples)
            say(f"no --anchors: every rollout of reward.kind={kind} must bring its prompt's anchors")
            return {}
        raise refuse(f"reward.kind={kind} needs each prompt's {' and '.join(columns)}: a JSON file mapping each "
                     "prompt to them")
    try:
        table = json.loads(Path(path).expanduser().read_text())
    except (OSError, ValueError) as e:
        raise refuse(str(e)) from None
    if not isinstance(table, dict):
        raise refuse(f"a JSON object mapping prompts, not a {type(table).__name__}")
    if "anchors" in columns:
        bad = next((p for p, a in table.items() if not (isinstance(a, list) and a and
                                                        all(isinstance(x, str) for x in a))), None)
        if bad is not None:
            raise refuse(f"prompt {bad[:60]!r} maps to {str(table[bad])[:60]!r}, not a list of texts")
        sizes = {len(a) for a in table.values()}
        if len(sizes) > 1:  # (AGR's rewards count anchors beaten: every prompt is judged against as many)
            first = {n: p for p, a in table.items() for n in [len(a)]}
            raise refuse("every prompt needs the same number of anchors; "
                         + ", ".join(f"prompt {first[n][:40]!r} has {n}" for n in sorted(sizes)))
        return {"anchors": table}
    bad = next((p for p, r in table.items() if not (isinstance(r, str) and r)), None)
    if bad is not None:
        raise refuse(f"prompt {bad[:60]!r} maps to {table[bad]!r}, not a reference text")
    return {"references": table}


def recipe_app(s, columns: dict | None = None, *, max_failed_fraction: float | None = None, **limits):
    """The reward service's app (`make_app`, with `limits`) for a recipe (`s`: a trainer config's settings): its
    GRM as a judge (in this process, or asked of `inference.url`'s servers with `inference.engine=openai`), its
    construction and settings as `GroupRewards`, `columns` from `read_columns`; a greedy SCR round robin asks its
    unfinished cohorts' pairs early (`Remembered`). A call whose judge requests failed beyond `max_failed_fraction`
    (default: the recipe's `inference.max_failed_fraction`) fails its cohorts. `GET /v1/recipe` answers the
    recipe (`rrc_jax.constructions.served.recipe`); `app.state.grm` names the GRM."""
    from rrc_jax.service.app import make_app  # the serve extra (starlette)

    kind, j = s.reward_kind, s.judge
    settings = s.constructions.get(kind)
    grm = Roles.of_run(s).path("grm")
    served = s.inference.options("grm")  # the judge's servers (a pool), or none: the judge in this process
    if served and j.force_verdicts:
        raise ConfigError("config.reward.judge.force_verdicts: a forced verdict is read from the judge's next-token "
                          "log-probs, which its servers (inference.engine='openai') do not return; judge in this "
                          "process or set force_verdicts=False")
    judge = judge_for(str(grm), template=j.template, max_new_tokens=j.max_new_tokens, temperature=j.temperature,
                      seed=s.seed, force_verdicts=j.force_verdicts, **(served or {"max_batch": j.max_batch}))
    # a greedy round robin's unfinished cohorts are asked early: their pairs' judgments are remembered
    early = kind == "scr" and settings.ordering == "round_robin" and j.temperature == 0
    if early:
        judge.sampler = Remembered(judge.sampler)

    def health() -> dict:
        return {**({"servers": judge.sampler.pool.health()} if served else {}),
                **({"remembered": judge.sampler.hits} if early else {})}

    rewards = GroupRewards(judge, kind, group_size=s.rollout.group_size, votes=j.votes, swap=j.swap, seed=s.seed,
                           **(dataclasses.asdict(settings) if settings is not None else {}))
    if max_failed_fraction is None:
        max_failed_fraction = s.inference.max_failed_fraction
    app = make_app(cohort_rewards(rewards, max_failed_fraction=max_failed_fraction, **(columns or {})),
                   group_size=s.rollout.group_size, judge_health=health, per_rollout=s.reward.per_response,
                   early=early, recipe=recipe(s), **limits)
    app.state.grm = grm
    return app
