"""The reward service and a trainer behind it, tried as a hostile client would: one client's text or a failing
judge never fails another's rewards, a failure is never kept as the answer, a dead judge is a failure (never a
reward of zeros), requests are bounded, a client's mistake is a 4xx, and a trainer behind the service checks its
recipe, waits for it, asks with ids of its own run and draw and a seed of its own, so that its rewards are exact
across a restart of the service."""

import json
import urllib.request

import numpy as np
import pytest
from conftest import post_json, read_metrics, tiny_config

from rrc_jax.config import validate
from rrc_jax.errors import ConfigError
from rrc_jax.inference.server import serving
from rrc_jax.service.app import make_app
from rrc_jax.service.cohorts import Answer, Cohort, Rollout
from rrc_jax.service.rewards import Remembered, cohort_rewards


def ranked(cohort):
    """Each rollout's reward: its completion's rank among its cohort's."""
    texts = sorted(r.completion for r in cohort.rollouts)
    return [Answer(reward=float(texts.index(r.completion))) for r in cohort.rollouts]


def group(name, size=2, **kw):
    return [{"prompt": f"p {name}", "completion": f"{name} {k}", "group_size": size, "group": name,
             "request_id": f"{name}.{k}", **kw} for k in range(size)]


def post(url, rollouts, headers=None):
    return post_json(url + "/v1/rewards", {"rollouts": rollouts}, headers)


def get(url, path, headers=None):
    request = urllib.request.Request(url + path, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_one_cohorts_failure_stays_its_own_and_is_not_kept():
    """A judge call that raises on one cohort's text: the cohort fails alone with the cause named, the clean cohort
    judged with it gets its rewards; the failed rollouts' retry (the judge recovered) is judged, not answered with
    the old error."""
    poisoned = {"on": True}

    def reward_cohorts(cohorts):
        if poisoned["on"] and any("bad" in r.completion for c in cohorts for r in c.rollouts):
            raise ValueError("the judge cannot take this text")
        return [ranked(c) for c in cohorts]

    app = make_app(reward_cohorts, poll_s=0.05)
    service = app.state.service
    with serving(app) as url:
        both = group("clean") + group("bad")  # one request: both cohorts ready in one judge call
        status, answer = post(url, both)
        assert status == 200 and answer["rewards"][:2] == [0.0, 1.0] and answer["rewards"][2:] == [None, None]
        assert answer["errors"][:2] == [None, None]
        assert all("ValueError: the judge cannot take this text" in e for e in answer["errors"][2:])
        poisoned["on"] = False
        status, answer = post(url, group("bad"))  # the same request ids again
        assert status == 200 and answer["rewards"] == [0.0, 1.0] and "errors" not in answer
    assert (service.stats.judged, service.stats.judge_failures, service.cohorts.stats.retries) == (2, 1, 0)


class FakeRewards:
    """`GroupRewards`' interface: rewards from each row's text and the call's seed, the calls recorded; a row
    holding "raise" raises, and `failing` makes every judge request fail (a dead pool: the rewards zeros)."""

    columns, kind = (), "scr"

    def __init__(self):
        self.calls, self.failing, self.last_metrics = [], False, {}

    def __call__(self, rows, step=None, *, group_size=None, seed=None):
        self.calls.append((seed, [r.completion for r in rows]))
        if any("raise" in r.completion for r in rows):
            raise UnicodeEncodeError("utf-8", "x", 0, 1, "surrogates not allowed")
        n = len(rows)
        self.last_metrics = {"judge/questions": float(n), "judge/requests": float(n),
                             "judge/failed_requests": float(n if self.failing else 0),
                             "judge/http_errors": float(n if self.failing else 0)}
        if self.failing:
            return np.zeros(n, np.float32)
        return np.array([(hash((seed, r.completion)) % 1000) / 1000 for r in rows], np.float32)


def cohort(serial, name, size=2, seed=None):
    rollouts = [Rollout(f"p {name}", f"{name} {k}", size, name, seed=seed) for k in range(size)]
    return Cohort(serial, name, f"p {name}", size, 0.0, seed=seed, rollouts=rollouts)


def test_a_requests_seed_makes_its_rewards_whatever_else_is_judged():
    """The cohorts of one seed are judged in a call of their own, in their order, the judge seeded with it: the
    same answers alone or beside other clients' cohorts; a cohort the judge cannot take fails alone, naming why."""
    rewards = FakeRewards()
    judge = cohort_rewards(rewards)
    alone = judge([cohort(0, "a", seed=7), cohort(1, "b", seed=7)])
    crowded = judge([cohort(5, "x"), cohort(6, "a", seed=7), cohort(7, "raise"), cohort(8, "b", seed=7),
                     cohort(9, "y", seed=8)])
    assert crowded[1] == alone[0] and crowded[3] == alone[1]
    assert (7, ["a 0", "a 1", "b 0", "b 1"]) in rewards.calls[-5:]
    assert all(a.error == "" for a in crowded[0]) and all(a.error == "" for a in crowded[4])
    assert all(a.reward is None and "UnicodeEncodeError" in a.error and "'raise'" in a.error for a in crowded[2])


def test_a_dead_judge_fails_its_cohorts_naming_the_failures_and_health_counts_them():
    rewards = FakeRewards()
    app = make_app(cohort_rewards(rewards, max_failed_fraction=0.5), poll_s=0.05)
    with serving(app) as url:
        rewards.failing = True
        status, answer = post(url, group("g"))
        assert status == 200 and answer["rewards"] == [None, None]
        assert "failed 2 of 2 requests (another HTTP error: 2)" in answer["errors"][0]
        assert "--max_failed_fraction=0.5" in answer["errors"][0]
        assert answer["judge"]["judge/failed_requests"] == 2
        health = get(url, "/health")[1]
        assert (health["failed"], health["judge_failures"], health["judged"]) == (2, 1, 0)
        rewards.failing = False  # the pool is back: the retry is judged
        status, answer = post(url, group("g"))
        assert status == 200 and None not in answer["rewards"] and answer["judge"]["judge/failed_requests"] == 0


def test_remembered_keeps_answers_only():
    """A greedy judge's memory keeps what the engine answered, never the empty rows of failed requests."""
    from rrc_jax.inference.sampler import SampleOutput, SamplingParams

    class Engine:
        def __init__(self):
            self.asked, self.down = [], True

        def complete(self, prefixes, suffixes, params, rng=0, *, streams=None, splits=None):
            self.asked.append(len(suffixes))
            self.last_failed = np.full(len(suffixes), self.down)
            n = len(suffixes)
            tokens = np.zeros((n, 2), np.int32) if self.down else np.ones((n, 2), np.int32)
            return SampleOutput(tokens, np.zeros((n, 2), np.float32), np.full(n, 0 if self.down else 2, np.int32),
                                np.zeros(n, bool))

    engine = Engine()
    judge = Remembered(engine)
    ask = lambda: judge.complete([[1, 2]], [(0, [3]), (0, [4])], SamplingParams(temperature=0))  # noqa: E731
    assert ask().lengths.tolist() == [0, 0]
    engine.down = False
    assert ask().lengths.tolist() == [2, 2] and engine.asked == [2, 2]  # asked again: nothing was remembered
    assert ask().lengths.tolist() == [2, 2] and engine.asked == [2, 2] and judge.hits == 2


def test_requests_are_bounded_and_take_turns():
    """A group over the largest size is a 400, a cohort beyond the open cap a 429, both naming their flag; a judge
    call takes the clients' units in turns (a request's seeded cohorts whole)."""
    from rrc_jax.service.app import turns

    app = make_app(lambda cohorts: [ranked(c) for c in cohorts], poll_s=0.05, max_group_size=8, max_open_cohorts=2)
    with serving(app) as url:
        status, answer = post(url, group("big", size=9)[:1])
        assert status == 400 and "--max_group_size=8" in answer["error"]["message"]
        status, answer = post(url, [r for name in "abc" for r in group(name, size=3)[:1]])
        assert status == 429 and "--max_open_cohorts=2" in answer["error"]["message"]
        assert get(url, "/health")[1]["open"] == 0  # the refused request counted nothing
    ready = [cohort(0, "a1", seed=1), cohort(1, "a2", seed=1), cohort(2, "a3"), cohort(3, "a4")]
    ready += [cohort(4, "b1")]
    for c in ready:
        c.client = "B" if c.key.startswith("b") else "A"
    taken, left = turns(ready, max_rollouts=5)
    assert [c.key for c in taken] == ["a1", "a2", "b1"] and [c.key for c in left] == ["a3", "a4"]
    assert [c.key for c in turns(ready, max_rollouts=1)[0]] == ["a1", "a2"]  # a unit is never split


@pytest.mark.parametrize("path,body,headers,message", [
    ("/v1/rewards", {"rollouts": [{"prompt": "p", "completion": "x", "group_size": 2, "\ud800": 1}]}, {},
     "a text holding a lone surrogate"),
    ("/v1/rewards", {"rollouts": [{"prompt": "p", "completion": "\ud800", "group_size": 2}]}, {},
     "the body.rollouts[0].completion: a text holding a lone surrogate"),
    ("/verify", {"responses_create_params": {"input": "p"}, "response": {"output": [
        {"type": "message", "content": [{"type": "output_text", "text": "\ud800"}]}]}}, {},
     "a text holding a lone surrogate"),
    ("/v1/rewards", None, {}, "the body's JSON is nested too deeply"),
    ("/v1/rewards", {"rollouts": []}, {"Authorization": "Bearer s\u00e9same"}, "Authorization"),
])
def test_a_clients_mistake_is_a_4xx_naming_it_and_counts_nothing(path, body, headers, message):
    app = make_app(lambda cohorts: [ranked(c) for c in cohorts], poll_s=0.05, group_size=2,
                   api_key="sesame" if headers else "")
    with serving(app) as url:
        if body is None:  # JSON nested 100,000 deep
            data = b"[" * 100_000 + b"]" * 100_000
        else:
            data = json.dumps(body).encode()
        heads = {"Content-Type": "application/json",
                 **{k: v.encode("utf-8").decode("latin-1") for k, v in headers.items()}}
        request = urllib.request.Request(url + path, data=data, headers=heads)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        assert caught.value.code == (401 if headers else 400)
        assert message in json.loads(caught.value.read())["error"]["message"]
        stats = get(url, "/health", {"Authorization": "Bearer sesame"})[1]
        assert stats["rollouts"] == stats["judge_calls"] == stats["requests"] == 0


def test_a_body_over_the_limit_stops_being_read_at_the_limit():
    """A chunked body without a Content-Length is read up to the limit, then refused (413 naming the flag)."""
    from test_serve import asgi_posts

    app = make_app(lambda cohorts: [ranked(c) for c in cohorts], max_body_bytes=1000)
    ((status, answer, read),) = asgi_posts(app, [[b" " * 100] * 2000], content_length=False, path="/v1/rewards")
    assert status == 413 and "--max_body_mb" in answer["error"]["message"] and read == 11


def test_a_trainer_waits_for_a_service_that_comes_back():
    """A request to a service that is away is asked again, the wait said, until it answers (a restart)."""
    import threading
    import time

    from rrc_jax.inference.server import bind
    from rrc_jax.service.remote import post_rewards

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()  # the port is free: nothing answers there yet
    url, lines, answers = f"http://127.0.0.1:{port}", [], []
    asking = threading.Thread(target=lambda: answers.append(post_rewards(
        url, group("g"), retries=0, wait_s=60, progress=lines.append)))
    asking.start()
    while not lines:
        time.sleep(0.05)
    app = make_app(lambda cohorts: [ranked(c) for c in cohorts], poll_s=0.05)
    with serving(app, port=port):
        asking.join(timeout=60)
    assert answers and answers[0]["rewards"] == [0.0, 1.0]
    assert "did not answer" in lines[0] and "asking again" in lines[0]


def test_health_and_recipe_need_the_key():
    app = make_app(lambda cohorts: [ranked(c) for c in cohorts], api_key="sesame", recipe={"kind": "scr"},
                   judge_health=lambda: {"servers": [{"url": "http://10.1.2.3:8000"}]})
    with serving(app) as url:
        assert get(url, "/health")[0] == get(url, "/v1/recipe")[0] == 401
        key = {"Authorization": "Bearer sesame"}
        assert get(url, "/v1/recipe", key) == (200, {"kind": "scr"})
        assert get(url, "/health", key)[1]["judge"]["servers"][0]["url"] == "http://10.1.2.3:8000"


def test_an_anchors_file_with_lists_of_different_lengths_is_refused(tmp_path):
    from rrc_jax.service.cohorts import COHORT_TIMEOUT_S
    from rrc_jax.service.rewards import read_columns

    path = tmp_path / "anchors.json"
    path.write_text(json.dumps({"p": ["a", "b"], "q": ["c"]}))
    with pytest.raises(ConfigError, match=f"--anchors={path}: every prompt needs the same number of anchors; prompt 'q' has "
                                          "1, prompt 'p' has 2"):
        read_columns(str(path), "agr", ("anchors",))
    assert COHORT_TIMEOUT_S == 100.0  # --cohort_timeout_s: below OpenRLHF's 180 s and slime's 120 s


def test_ids_are_unique_per_draw_and_per_run_and_kept_by_a_resume(tmp_path, monkeypatch):
    """A run's id is kept while its workdir holds a checkpoint and drawn anew otherwise; each draw of a step is a
    request of its own ids, carrying the step's seed."""
    import rrc_jax.constructions.served as served
    from rrc_jax.constructions.base import step_seed
    from rrc_jax.constructions.scr import SCRReward

    first = served.run_id(tmp_path)
    assert served.run_id(tmp_path) != first  # no checkpoint: a new run
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    kept = served.run_id(tmp_path)
    assert served.run_id(tmp_path) == kept  # a resume
    sent = []
    monkeypatch.setattr(served, "post_rewards", lambda url, rollouts, **kw: sent.append(rollouts) or {
        "rewards": [0.0] * len(rollouts), "cohorts": [0] * len(rollouts)})
    reward = served.served(SCRReward)("http://127.0.0.1:1", kept, seed=5)
    for _ in range(2):  # dynamic sampling's two draws of step 4
        reward.construct(["p"], [["x", "y"]], np.array([0]), 4)
    ids = [[r["request_id"] for r in request] for request in sent]
    assert ids[0] == [f"{kept}/4/0/0/0/0", f"{kept}/4/0/0/0/1"] and ids[1][0] == f"{kept}/4/1/0/0/0"
    assert {r["seed"] for request in sent for r in request} == {step_seed(5, 4)}


def test_a_trainer_checks_the_services_recipe_and_waits_for_it(tmp_path, toy_cache):
    """Before loading: another recipe is a one-line error naming the difference; a service that does not answer is
    waited for (its progress said), then a one-line error naming the fix."""
    from rrc_jax.constructions.served import recipe, wait_for_service

    ours = validate(tiny_config("agr", tmp_path / "a", toy_cache, **{"reward.service_url": "http://127.0.0.1:9",
                                                                      "eval.judge_votes": 0}))
    other = validate(tiny_config("scr", tmp_path / "b", toy_cache))
    app = make_app(lambda cohorts: [ranked(c) for c in cohorts], recipe=recipe(other))
    with serving(app) as url:
        moved = validate(tiny_config("agr", tmp_path / "a", toy_cache, **{"reward.service_url": url,
                                                                           "eval.judge_votes": 0}))
        with pytest.raises(ConfigError, match=r"serves another recipe \(group_size|serves another recipe \(kind: "
                                              r"this run's 'agr', the service's 'scr'\)"):
            moved.reward.preflight(moved)
    lines = []
    with pytest.raises(ConfigError, match="did not answer within 0.3 s.*raise reward.service_wait_s"):
        wait_for_service(ours.reward_service, wait_s=0.3, poll_s=0.1)
    ticks = iter(range(100))
    with pytest.raises(ConfigError):
        wait_for_service("http://127.0.0.1:9", wait_s=3, poll_s=1, clock=lambda: next(ticks),
                         sleep=lambda s: lines.append(s))
    assert lines  # it waited


def test_a_served_run_with_dynamic_sampling_is_exact_across_a_restart_of_its_service(tmp_path, toy_cache,
                                                                                     monkeypatch):
    """SCR with dynamic sampling and a sampled judge, rewarded by a service: a run whose service is replaced by a
    fresh one (a restart: nothing remembered, its judge's stream anew) after step 1 logs every metric of the run
    served by one service throughout, times aside."""
    import rrc_jax.constructions.served as served
    from rrc_jax.rl.trainer import run
    from rrc_jax.service.rewards import recipe_app

    common = {"eval.judge_votes": 0, "rl.dynamic_sampling": True, "rl.max_draws": 2,
              "rl.group_size": 2, "reward.judge.temperature": 1.0}  # (pairs often tie: a step draws again)
    recipe = validate(tiny_config("scr", tmp_path / "service", toy_cache, **common))
    real_post, calls = served.post_rewards, []
    runs = {}
    for way in ("uninterrupted", "restarted"):
        first, second = recipe_app(recipe, poll_s=0.02), recipe_app(recipe, poll_s=0.02)
        with serving(first) as url_a, serving(second) as url_b:
            def post(url, rollouts, **kw):
                step = int(rollouts[0]["request_id"].split("/")[1])
                calls.append((way, step))
                restarted = way == "restarted" and step > 1
                return real_post(url_b if restarted else url_a, rollouts, **kw)

            monkeypatch.setattr(served, "post_rewards", post)
            workdir = run(validate(tiny_config("scr", tmp_path / way, toy_cache, **common,
                                               **{"reward.service_url": url_a})))
            runs[way] = read_metrics(workdir)
            if way == "restarted":
                assert second.state.service.stats.judged > 0
    assert max(step for _, step in calls) == 2
    keep = lambda row: {k: v for k, v in row.items() if not k.startswith(("time/", "memory/", "system/"))  # noqa
                        and k != "tokens_per_second"}
    assert {s: keep(r) for s, r in runs["restarted"].items()} == {s: keep(r) for s, r in runs["uninterrupted"].items()}
    assert any(r.get("data/draws_per_step", 1) > 1 for r in runs["uninterrupted"].values())
    assert any(r.get("reward/std", 0) > 0 for r in runs["uninterrupted"].values())
