"""A reward construction from a module outside the package gets a built-in one's treatment, from
config validation through the planner to two trainer steps, its metrics in `metrics.jsonl` and its judgments in
`samples/`. The construction is `circular` (each response judged against the next one in its group, i against
i + 1 mod m: m questions per vote), written here as a user would write it."""

import json
import textwrap

import numpy as np
import pytest

from conftest import read_metrics, tiny_config
from rrc_jax import plan
from rrc_jax.config import base_config, validate
from rrc_jax.constructions import construction_class
from rrc_jax.errors import ConfigError
from rrc_jax.rl.trainer import run

CIRCULAR = textwrap.dedent('''
    import numpy as np

    from rrc_jax.constructions import JudgeConstruction, RewardResult
    from rrc_jax.errors import ConfigError


    class Circular(JudgeConstruction):
        """Response i against response i + 1 mod m, V votes each; the reward is its wins minus its losses over
        its two games (as the earlier response of one pair and the later of another), per vote."""

        @classmethod
        def questions_per_prompt(cls, s):
            return s.rollout.group_size * s.judge.votes

        @classmethod
        def check(cls, s):
            if s.rollout.group_size < 3:
                raise ConfigError("config.rl.group_size: a circle needs at least 3 responses")

        @classmethod
        def from_settings(cls, s, ctx):
            return cls(**cls.judge_kwargs(s, ctx))

        def construct(self, prompts, responses, prompt_index, step):
            b, m = len(prompts), len(responses[0])
            v = self.ctx.settings.judge.votes
            g, i = np.repeat(np.arange(b), m), np.tile(np.arange(m), b)
            votes, _ = self.judge.pair_votes(prompts, g, [responses[x][y] for x, y in zip(g, i)],
                                             [responses[x][(y + 1) % m] for x, y in zip(g, i)], v, True,
                                             tags=[{"i": int(y), "j": int((y + 1) % m)} for y in i])
            net = (votes.wins - votes.losses).reshape(b, m).astype(np.float32)
            rewards = (net - np.roll(net, 1, axis=1)) / v  # i's game as A, minus i - 1's game where i was B
            decided = float(np.mean(votes.wins + votes.losses > 0))
            return RewardResult(rewards, {"circular/decided": decided},
                                notes=[{"opponents": "i + 1 mod m"}] * b)


    class WithCritic(Circular):
        @classmethod
        def roles(cls, s):
            return super().roles(s) | {"critic"}
''')


@pytest.fixture
def circular(tmp_path, monkeypatch):
    (tmp_path / "circular_reward.py").write_text(CIRCULAR)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "circular_reward:Circular"


def test_a_construction_from_outside_the_package_through_validation_planner_and_training(circular, tmp_path,
                                                                                         toy_cache):
    config = base_config("agr")
    config.reward.kind = circular
    validate(config)
    config.rl.group_size, config.rl.minibatch_size = 2, 32
    with pytest.raises(ConfigError, match="a circle needs at least 3 responses"):
        validate(config)
    config.reward.kind = "circular_reward:WithCritic"  # a role no run has: one line, before anything loads
    with pytest.raises(ConfigError, match="asks for the roles critic; a construction's roles are reference, grm"):
        validate(config)

    # the planner: the roles it declares (the GRM; the reference for the judged evaluation) and its questions
    config = base_config("agr")
    config.reward.kind = circular
    config.models.policy = config.models.grm = "llama3-8b"
    assert list(plan.roles(validate(config))) == ["policy", "reference", "grm"]
    config.eval.judge_votes, config.rl.beta = 0, 0.0
    assert list(plan.roles(validate(config))) == ["policy", "grm"]
    load = construction_class(circular).judge_load(validate(config))
    assert load == (8 * 2, 8 * 2 * config.reward.judge.max_new_tokens, 8, 8 * 2)  # both orders of 8 pairs
    p = plan.plan(validate(config), "v5p-64")
    assert any(r.name == "judge KV cache" and r.detail.startswith(f"{circular}: ") for r in p.rows)
    assert any("16 questions (16 different) and up to 384 judge tokens per prompt" in n for n in p.notes)

    # two steps: its rewards train, its metrics and judgments are written
    workdir = tmp_path / "w"
    run(validate(tiny_config("agr", workdir, toy_cache, **{"reward.kind": circular, "log.samples_every": 1})))
    rows = read_metrics(workdir)
    assert sorted(rows) == [0, 1, 2]
    b, m, v = 4, 4, 2  # TINY_RUN: 4 prompts x 4 responses, reward.judge.votes 2
    for step in (1, 2):
        assert 0 <= rows[step]["circular/decided"] <= 1
        assert rows[step]["judge/questions"] == b * m * v
    assert "eval/win_rate_vs_reference" in rows[2]  # the JudgeConstruction's held-out evaluation
    assert not (workdir / "anchors.jsonl").exists()
    for step in (1, 2):
        records = [json.loads(line) for line in (workdir / "samples" / f"step_{step}.jsonl").read_text().splitlines()]
        assert records and all(r["opponents"] == "i + 1 mod m" for r in records)
        for r in records:
            assert len(r["judgments"]) == m * v
            assert {(j["i"], j["j"]) for j in r["judgments"]} == {(i, (i + 1) % m) for i in range(m)}
            rewards = np.array([x["reward"] for x in r["responses"]])
            assert abs(rewards.sum()) < 1e-5  # every game's win is another's loss
