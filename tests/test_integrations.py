"""RRC rewards from other trainers (`rrc_jax.integrations`): a group split across processes is judged whole; each
kind's rewards are what `rrc_jax.rewards` computes from the judge's own verdicts; TRL's GRPOTrainer trains two steps
with the TRL reward function pointed at the reward service, which gives the in-process rewards."""

import concurrent.futures
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import post_json

from rrc_jax.config import validate
from rrc_jax.data.toy.task import SortTask
from rrc_jax.inference.server import serving
from rrc_jax.integrations.groups import Alone, GroupRewards, Row, judge_whole, rows_of
from rrc_jax.service.app import make_app
from rrc_jax.service.rewards import cohort_rewards
from rrc_jax.rewards import agr_rewards, cara_rewards, scr_rewards

G = 4


class Threads:
    """A `Collective` of `size` threads standing for processes: `all_gather` is a real collective (every rank
    waits for the others)."""

    def __init__(self, size):
        self.size, self.slots, self.barrier = size, [None] * size, threading.Barrier(size)

    def rank(self, r):
        outer = self

        class Rank:
            rank, size = r, outer.size

            def all_gather(self, items):
                outer.slots[r] = list(items)
                outer.barrier.wait()
                out = [x for slot in outer.slots for x in slot]
                outer.barrier.wait()  # every rank has read before the next gather writes
                return out

        return Rank()


def test_a_group_split_across_two_processes_is_judged_whole():
    """Slices of 6 completions with groups of 4 (TRL with per_device_train_batch_size=6, num_generations=4): each
    group is judged once, whole, on one process, and each process gets its own rows' rewards, the ones a single
    process judging the whole batch gives."""
    rows = [Row(f"p{g}", f"c{g}.{i}") for g in range(3) for i in range(G)]
    judged = []

    def reward_groups(whole):
        judged.append([r.completion for r in whole])
        return np.array([float(r.completion.endswith(("1", "2"))) + int(r.prompt[1:]) for r in whole], np.float32)

    expected = reward_groups(rows)
    judged.clear()
    comm, out = Threads(2), [None, None]

    def process(r):
        out[r] = judge_whole(rows[6 * r:6 * r + 6], G, reward_groups, comm.rank(r))

    threads = [threading.Thread(target=process, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert np.concatenate(out).tolist() == expected.tolist()
    assert sorted(judged) == [[f"c{g}.{i}" for g in (0, 2) for i in range(G)], [f"c1.{i}" for i in range(G)]]

    # whole groups in every slice: judged where they are, nothing gathered
    judged.clear()
    assert judge_whole(rows[:8], G, reward_groups).tolist() == expected[:8].tolist() and len(judged) == 1
    with pytest.raises(ValueError, match="do not share one prompt"):
        judge_whole(rows[2:10], G, reward_groups)
    with pytest.raises(ValueError, match="not whole groups of 4"):
        judge_whole(rows[:6], G, reward_groups)


@pytest.fixture(scope="module")
def toy_judge(toy_cache):
    """The toy world's GRM judging greedily in this process, and the toy policy's directory."""
    from conftest import tiny_config

    from rrc_jax.integrations import judge_for
    from rrc_jax.rl.roles import Roles

    roles = Roles.of_run(validate(tiny_config("scr", "unused", toy_cache)))
    return judge_for(str(roles.path("grm")), template="toy_pairwise_cot", max_new_tokens=48,
                     temperature=0.0), roles.path("policy")


DIGITS = ["3142", "97531", "2718", "60504"]
RESPONSES = [["1234", "1243", "1324", "4321"], ["13579", "31579", "1357", "97531"], ["1278", "1287", "2178", "8721"],
             ["00456", "00465", "04056", "65400"]]


def _counts(trace, b, m, key="j"):
    """Vote counts `[b, m, m]` (or `[b, m, n]` wins and losses for AGR) from the judge's own trace."""
    wins, losses = np.zeros((b, m, m), np.int32), np.zeros((b, m, m), np.int32)
    for t in trace:
        if t["winner"] == "a":
            wins[t["prompt"], t["i"], t[key]] += 1
        elif t["winner"] == "b":
            losses[t["prompt"], t["i"], t[key]] += 1
    return wins, losses


@pytest.mark.parametrize("kind", ["scr", "cara", "agr"])
def test_each_kind_rewards_what_rrc_rewards_computes_from_the_verdicts(toy_judge, kind):
    """SCR, SCR with CARA (its `cara` setting, as in the trainer's config) and AGR: the rewards are `rrc_jax.rewards`'
    of the judge's own verdicts."""
    judge, _ = toy_judge
    prompts = [SortTask.prompt_text(d) for d in DIGITS]
    anchors = [[r[0], r[3]] for r in RESPONSES]  # AGR: two anchors a prompt
    rows = rows_of([p for p in prompts for _ in range(G)], [c for r in RESPONSES for c in r],
                   anchors=[a for a in anchors for _ in range(G)] if kind == "agr" else None)
    if kind == "cara":
        rewards = GroupRewards(judge, "scr", group_size=G, votes=2, cara=True)
    else:
        rewards = GroupRewards(judge, kind, group_size=G, votes=2)
    judge.trace = []
    got = rewards(rows, step=3).reshape(len(prompts), G)
    trace, judge.trace = judge.trace, None
    assert len(trace) == len(prompts) * (G * 2 if kind == "agr" else G * (G - 1) // 2) * 2
    if kind == "agr":
        wins, losses = _counts([{**t, "j": t["anchor"]} for t in trace], len(prompts), G)
        expected = agr_rewards(wins[..., :2], losses[..., :2], alpha=0.1, ties="win")
    else:
        wins, losses = _counts(trace, len(prompts), G)
        counts = wins + np.swapaxes(losses, 1, 2)  # c[b, i, j]: votes for i over j
        expected = cara_rewards(counts, alpha=0.1) if kind == "cara" else scr_rewards(counts, alpha=0.1, ties="zero")
    np.testing.assert_allclose(got, np.asarray(expected), atol=1e-6)
    assert np.ptp(got) > 0 and rewards.last_metrics["judge/questions"] == len(trace)


@pytest.mark.parametrize("kind", ["scr", "agr"])
def test_the_reward_service_gives_the_in_process_rewards(toy_judge, kind):
    """The toy GRM behind the reward service on the loopback (`rrc_jax.service`): every rollout of 4 groups its own
    request, all in flight in a random order, AGR's anchors from the service's table: each reward equals
    `GroupRewards`' in this process on the same rows (greedy). SCR's service asks its unfinished cohorts early
    (half of each group first, then the rest) and remembers those judgments."""
    from rrc_jax.service.rewards import Remembered

    judge, _ = toy_judge
    prompts = [SortTask.prompt_text(d) for d in DIGITS]
    anchors = {p: [r[0], r[3]] for p, r in zip(prompts, RESPONSES)}
    rows = rows_of([p for p in prompts for _ in range(G)], [c for r in RESPONSES for c in r],
                   anchors=[anchors[p] for p in prompts for _ in range(G)] if kind == "agr" else None)
    rewards = GroupRewards(judge, kind, group_size=G, votes=2)
    want = rewards(rows, step=0)
    work = [(i, {"prompt": r.prompt, "completion": r.completion, "group_size": G, "request_id": str(i)})
            for i, r in enumerate(rows)]
    random.Random(1).shuffle(work)
    early = kind == "scr"
    first = [w for w in work if int(w[0]) % G < G // 2] if early else work  # (SCR: half of each group first)
    engine = judge.sampler
    judge.sampler = Remembered(engine) if early else engine
    try:
        app = make_app(cohort_rewards(rewards, anchors=anchors), poll_s=0.05, early=early)
        with serving(app) as url, concurrent.futures.ThreadPoolExecutor(len(work)) as pool:
            ask = lambda w: (w[0], post_json(url + "/v1/rewards", {"rollouts": [w[1]]}))  # noqa: E731
            waiting = [pool.submit(ask, w) for w in first]
            while early and app.state.service.stats.early_calls == 0:
                time.sleep(0.05)
            waiting += [pool.submit(ask, w) for w in work if w not in first]
            answers = dict(w.result(timeout=300) for w in waiting)
        hits = judge.sampler.hits if early else 0
    finally:
        judge.sampler = engine
    assert all(status == 200 for status, _ in answers.values()), answers
    assert not early or hits > 0  # the early judgments were read back
    np.testing.assert_array_equal([answers[i][1]["rewards"][0] for i in range(len(rows))], want)


def test_trl_and_tunix_rewards_pointed_at_the_service_equal_the_ones_with_the_judge(toy_judge):
    """`TRLReward(url, group_size=G)` and `TunixReward(url)` (the reward service's recipe: SCR voting@2 with the toy
    GRM) give what they give with the judge in this process (greedy); a served reward refuses settings of its
    own."""
    from rrc_jax.integrations.trl import TRLReward
    from rrc_jax.integrations.tunix import TunixReward

    judge, _ = toy_judge
    prompts = [SortTask.prompt_text(d) for d in DIGITS for _ in range(G)]
    completions = [c for r in RESPONSES for c in r]
    local = TRLReward(judge, "scr", group_size=G, votes=2, comm=Alone())(prompts, completions)
    app = make_app(cohort_rewards(GroupRewards(judge, "scr", group_size=G, votes=2)), poll_s=0.05)
    with serving(app) as url:
        served = TRLReward(url, group_size=G, comm=Alone())
        assert served(prompts, completions) == local and served.__name__ == "rrc_served"
        assert TunixReward(url)(prompts=prompts, completions=completions, num_generations=G) == local
    assert TunixReward(judge, "scr", votes=2)(prompts=prompts, completions=completions, num_generations=G) == local
    assert app.state.service.stats.judged == 2 * len(DIGITS) and app.state.service.stats.judge_calls == 2
    with pytest.raises(ValueError, match="votes: a served reward's settings are its recipe's"):
        TRLReward("http://127.0.0.1:1", group_size=G, votes=2)


def test_trl_grpo_trains_two_steps_with_rrc_rewards_from_the_service(toy_judge, tmp_path, monkeypatch):
    """TRL's GRPOTrainer (CPU) trains the toy policy two steps (`examples/trl_rewards.py`'s trainer) with rewards
    from the reward service (`TRLReward(url, group_size=G)`; the service's recipe: SCR voting@1 with the toy GRM):
    each call's rewards equal the in-process `TRLReward`'s on the same completions, which are `scr_rewards` of the
    vote counts read from the judge's own trace; TRL logs their mean, and the policy's weights move."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))
    import torch
    from trl_rewards import make_trainer

    from rrc_jax.integrations.trl import TRLReward

    judge, policy_dir = toy_judge
    local = TRLReward(judge, "scr", group_size=G, votes=1)
    app = make_app(cohort_rewards(GroupRewards(judge, "scr", group_size=G, votes=1)), poll_s=0.05)
    calls = []
    with serving(app) as url:
        served = TRLReward(url, group_size=G)

        def recorded(prompts, completions, **kwargs):
            out = served(prompts, completions, **kwargs)
            judge.trace = []
            want = local(prompts, completions)
            calls.append((list(prompts), out, want, judge.trace, kwargs["trainer_state"].global_step))
            judge.trace = None
            return out

        recorded.__name__ = served.__name__
        torch.manual_seed(0)
        trainer = make_trainer(str(policy_dir), recorded, output_dir=str(tmp_path), group=G)
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()

    assert [c[4] for c in calls] == [0, 1] and all(len(c[0]) == 2 * G for c in calls)
    assert app.state.service.stats.judged == 2 * 2 and app.state.service.cohorts.stats.retries == 0
    for prompts, out, want, trace, _ in calls:
        assert out == want
        assert all(len(set(prompts[i:i + G])) == 1 for i in range(0, len(prompts), G))
        wins, losses = _counts(trace, len(prompts) // G, G)
        expected = np.asarray(scr_rewards(wins + np.swapaxes(losses, 1, 2), alpha=0.1, ties="zero")).reshape(-1)
        np.testing.assert_allclose(out, expected, atol=1e-6)
    logged = [h["rewards/rrc_served/mean"] for h in trainer.state.log_history if "rewards/rrc_served/mean" in h]
    np.testing.assert_allclose(logged, [np.mean(c[1]) for c in calls], atol=1e-5)
    assert any(np.ptp(c[1]) > 0 for c in calls)  # the judge ranked something
    moved = max(float((p.detach() - before[n]).abs().max()) for n, p in trainer.model.named_parameters())
    assert moved > 0


def test_trl_reward_names_a_row_that_is_not_text_and_logs_no_rate_of_nothing(toy_judge):
    """A completion that is not a string or a conversation is a `TypeError` naming its row and the types taken; a
    rate of nothing (`judge/position_consistency` with one vote a pair: no swapped couple, NaN) is not sent to TRL's
    log, whose other values are."""
    import math

    from rrc_jax.integrations.groups import Alone
    from rrc_jax.integrations.trl import TRLReward

    judge, _ = toy_judge
    reward = TRLReward(judge, "scr", group_size=G, votes=1, comm=Alone())
    prompts = [SortTask.prompt_text(DIGITS[0])] * G
    completions = list(RESPONSES[0][:3]) + [1234]
    with pytest.raises(TypeError, match=r"^completion 3 is int '1234': the rewards take a string or a conversation "
                                        r"\(a list of \{'role': \.\.\., 'content': str\} messages\)$"):
        reward(prompts, completions)
    with pytest.raises(TypeError, match=r"^completion 0 is list '\[1, 2\]'"):
        reward(prompts, [[1, 2]] + RESPONSES[0][1:])
    logged = {}
    rewards = reward(prompts, [[{"role": "assistant", "content": c}] for c in RESPONSES[0]],
                     log_metric=lambda name, value: logged.__setitem__(name, value))
    assert len(rewards) == G and math.isnan(reward.rewards.last_metrics["judge/position_consistency"])
    assert "judge/position_consistency" not in logged and logged["judge/questions"] == G * (G - 1) // 2
    assert all(not math.isnan(v) for v in logged.values())


def test_group_kinds_come_from_the_registry_with_their_settings(toy_judge):
    """Every kind that can reward a group without this trainer is offered (a tournament too), with its own settings
    checked; a kind that needs this trainer (the DRM, a DRM-seeded knockout) or a setting it does not have is one
    `ValueError` naming it."""
    from rrc_jax.constructions.registry import group_kinds

    judge, _ = toy_judge
    assert group_kinds() == ["prc", "scr", "agr", "swiss", "double_elimination", "seeded_knockout", "circular",
                             "active", "agr_sequential"]
    prompts = [SortTask.prompt_text(d) for d in DIGITS]
    rows = rows_of([p for p in prompts for _ in range(G)], [c for r in RESPONSES for c in r])
    swiss = GroupRewards(judge, "swiss", group_size=G, votes=1, rounds=2)
    got = swiss(rows, step=1).reshape(len(prompts), G)
    assert swiss.last_metrics["judge/comparisons"] == 2 * (G // 2)  # rounds x duels a round
    assert (np.sort(got, axis=1) <= 0.1 * (G - 1) + 1e-6).all() and np.ptp(got) > 0
    with pytest.raises(ValueError, match=r"kind='drm': the kinds that reward another trainer's groups are prc, scr"):
        GroupRewards(judge, "drm", group_size=G)
    with pytest.raises(ValueError, match=r"kind='seeded_knockout' .* rewards inside this trainer only"):
        GroupRewards(judge, "seeded_knockout", group_size=G)
    GroupRewards(judge, "seeded_knockout", group_size=G, seed_by="index")
    with pytest.raises(ValueError, match=r"^cara: not settings of 'agr' \(it has alpha, ties, n_anchors"):
        GroupRewards(judge, "agr", group_size=G, cara=True)
