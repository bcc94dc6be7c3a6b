"""The reward service's endpoint (`rrc_jax.service.app`) on the loopback, with a judge that ranks a cohort's
completions by their text: concurrent clients sending rollouts one at a time in random order, with retries, get
their cohort's rewards, no cohort mixed or counted twice; bad requests are 4xx naming the field and count nothing;
a cohort that never completes is judged as it is (two rollouts or more) or failed naming its group."""

import concurrent.futures
import json
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import post_json

from rrc_jax.data.toy.task import SortTask
from rrc_jax.inference.server import serving
from rrc_jax.service.app import make_app, service_server
from rrc_jax.service.cohorts import Answer


def rank_judge(calls):
    """Each rollout's reward: its completion's rank among its cohort's (sorted texts); `calls` records each call's
    cohorts."""
    def reward_cohorts(cohorts):
        calls.append([(c.key, len(c.rollouts)) for c in cohorts])
        return [[Answer(reward=float(sorted(x.completion for x in c.rollouts).index(r.completion)))
                 for r in c.rollouts] for c in cohorts]
    return reward_cohorts


def post(url, body):
    return post_json(url + "/v1/rewards", body)


def health(url):
    with urllib.request.urlopen(url + "/health", timeout=30) as response:
        return json.loads(response.read())


def rollout(group, k, size, **kw):
    return {"prompt": f"prompt {group}", "completion": f"answer {(7 * k + group) % size} of {group}",
            "group_size": size, "group": f"g{group}", "request_id": f"{group}.{k}", **kw}


def expected(group, size):
    texts = sorted(f"answer {(7 * k + group) % size} of {group}" for k in range(size))
    return {f"{group}.{k}": float(texts.index(f"answer {(7 * k + group) % size} of {group}")) for k in range(size)}


def test_concurrent_clients_in_random_order_with_retries_get_their_cohorts_rewards():
    """12 cohorts of 4 rollouts sent one a request, all in flight at once in a random order (a request waits for
    its cohort: a trainer sends its rollouts concurrently), 10% of them sent twice: every reward is its cohort's
    rank, each rollout counted once, each cohort judged once and whole."""
    groups, size, calls = 12, 4, []
    work = [rollout(g, k, size) for g in range(groups) for k in range(size)]
    rng = random.Random(0)
    work += rng.sample(work, len(work) // 10)  # the retries
    rng.shuffle(work)
    with serving(make_app(rank_judge(calls), poll_s=0.05)) as url:
        with concurrent.futures.ThreadPoolExecutor(len(work)) as pool:
            answers = list(pool.map(lambda item: (item["request_id"], post(url, {"rollouts": [item]})), work))
        stats = health(url)
    got = {}
    for request_id, (status, answer) in answers:
        assert status == 200, answer
        assert got.setdefault(request_id, answer["rewards"][0]) == answer["rewards"][0]  # a retry: the same
    assert got == {k: v for g in range(groups) for k, v in expected(g, size).items()}
    judged = sorted(key for call in calls for key, n in call)
    assert judged == sorted(f"g{g}" for g in range(groups)) and all(n == size for call in calls for _, n in call)
    assert stats["rollouts"] == groups * size and stats["retries"] == len(work) - groups * size
    assert stats["whole"] == groups == stats["judged"] and stats["open"] == 0 and stats["failed"] == 0
    assert stats["judge_calls"] == len(calls) <= groups


def test_a_batch_of_whole_groups_is_answered_in_order():
    calls = []
    body = {"rollouts": [rollout(g, k, 3) for k in range(3) for g in range(2)]}  # the groups interleaved
    with serving(make_app(rank_judge(calls), poll_s=0.05)) as url:
        status, answer = post(url, body)
        again = post(url, body)  # the whole request retried: the same answers, nothing counted again
        stats = health(url)
    assert status == 200 and again == (200, answer)
    want = {**expected(0, 3), **expected(1, 3)}
    assert answer["rewards"] == [want[r["request_id"]] for r in body["rollouts"]]
    assert len(set(answer["cohorts"])) == 2 and "errors" not in answer
    assert stats["rollouts"] == 6 and stats["retries"] == 6 and stats["judged"] == 2
    with serving(make_app(rank_judge([]), poll_s=0.05)) as url:  # without request ids: each a new rollout
        bare = [{k: v for k, v in r.items() if k != "request_id"} for r in body["rollouts"]]
        assert post(url, {"rollouts": bare}) == (200, answer)


@pytest.mark.parametrize("body, status, message", [
    ({"rollouts": []}, 400, "rollouts: a list of 1 to 64 rollouts"),
    ({"rollouts": [{"completion": "x", "group_size": 2}]}, 400, "rollouts[0].prompt: missing"),
    ({"rollouts": [{"prompt": "p", "completion": "x", "group_size": "2"}]}, 400,
     "rollouts[0].group_size: str, not int"),
    ({"rollouts": [{"prompt": "p", "completion": "x", "group_size": 1}]}, 400,
     "rollouts[0].group_size: 1, a group has at least 2"),
    ({"rollouts": [{"prompt": "p", "completion": "x", "group_size": 2, "score": 1}]}, 400,
     "rollouts[0].score: not a field of a rollout"),
    ({"rollouts": [], "n": 2}, 400, "n: not fields of a rewards request"),
    ({"rollouts": [{"prompt": "p", "completion": "x", "group_size": 2, "group": "g"},
                   {"prompt": "q", "completion": "y", "group_size": 2, "group": "g"}]}, 409,
     "prompt of a rollout of group 'g' differs"),
    ({"rollouts": [{"prompt": "p", "completion": "x", "group_size": 2, "request_id": "r"},
                   {"prompt": "p", "completion": "y", "group_size": 2, "request_id": "r"}]}, 409,
     "request_id 'r' is given twice in one request"),
    ({"rollouts": [{"prompt": "p", "completion": "x", "group_size": 2, "anchors": ["a", 3]}]}, 400,
     "rollouts[0].anchors: a list of texts"),
    ({"rollouts": [{"prompt": "p", "completion": "x", "group_size": 2, "anchors": ["a"]},
                   {"prompt": "p", "completion": "y", "group_size": 2, "anchors": ["b"]}]}, 409,
     "anchors of a rollout of group 'p' differs"),
])
def test_a_bad_request_is_a_4xx_naming_the_field_and_counts_nothing(body, status, message):
    with serving(make_app(rank_judge([]), max_rollouts=64)) as url:
        got = post(url, body)
        stats = health(url)
    assert got[0] == status and got[1]["error"]["message"].startswith(message), got
    assert stats["rollouts"] == 0 and stats["bad_requests"] == 1 and stats["open"] == 0


def test_openrlhf_and_slime_requests_get_their_groups_rewards():
    """OpenRLHF's request (`{"query": [prompt + response], "prompts": [prompt], "labels": [label]}`, one rollout a
    request, and the empty lists its second URL gets) and slime's (`{"prompt", "response", "label"}`, answered with
    a bare number), all of a group in flight at once: each reward is its cohort's rank; a service without a group
    size refuses them naming the setting."""
    prompt = "<|im_start|>user\nSort 3142<|im_end|>\n<|im_start|>assistant\n"
    texts = ["1234<|im_end|>", "4321<|im_end|>", "1243<|im_end|>", "2134<|im_end|>"]
    want = [float(sorted(texts).index(x)) for x in texts]
    with serving(make_app(rank_judge([]), group_size=4, poll_s=0.05)) as url:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            openrlhf = list(pool.map(lambda x: post_json(url + "/openrlhf", {
                "query": [prompt + x], "prompts": [prompt], "labels": ["1234"]}), texts))
            slime = list(pool.map(lambda x: post_json(url + "/slime", {
                "prompt": [{"role": "user", "content": "Sort 3142"}], "response": x, "label": None}), texts))
        empty = post_json(url + "/openrlhf", {"query": [], "prompts": [], "labels": []})
        bad = post_json(url + "/openrlhf", {"query": ["elsewhere"], "prompts": [prompt], "labels": [""]})
    assert [a for _, a in openrlhf] == [{"rewards": [w], "scores": [w], "extra_logs": {}} for w in want]
    assert [a for _, a in slime] == want and all(s == 200 for s, _ in openrlhf + slime)
    assert empty == (200, {"rewards": [], "scores": [], "extra_logs": {}})
    assert bad[0] == 400 and bad[1]["error"]["message"].startswith("query[0]: does not start with prompts[0]")
    with serving(make_app(rank_judge([]))) as url:
        status, answer = post_json(url + "/slime", {"prompt": "p", "response": "r", "label": None})
    assert status == 400 and "--config.rl.group_size" in answer["error"]["message"]


def test_a_per_rollout_reward_judges_each_rollout_as_it_arrives():
    """With `per_rollout` (AGR, PRC: a rollout's reward does not depend on its group) a rollout is answered without
    waiting for its group: two of a group of 4 are judged and answered, each alone, while the others never come; the
    rollouts that arrive together share a judge call; a retry gets its first answer."""
    calls = []
    with serving(make_app(rank_judge(calls), poll_s=0.05, per_rollout=True)) as url:
        first = post(url, {"rollouts": [rollout(0, 0, 4)]})
        both = post(url, {"rollouts": [rollout(0, 1, 4), rollout(1, 0, 4)]})
        again = post(url, {"rollouts": [rollout(0, 1, 4)]})
        stats = health(url)
    assert first[0] == both[0] == again[0] == 200 and "errors" not in both[1]
    assert first[1]["rewards"] == [0.0] and both[1]["rewards"] == [0.0, 0.0] and again[1] == {
        "rewards": [0.0], "cohorts": both[1]["cohorts"][:1]}
    assert [len(c) for c in calls] == [1, 2] and all(size == 1 for call in calls for _, size in call)
    assert (stats["rollouts"], stats["retries"], stats["open"], stats["judged"]) == (3, 1, 0, 3)


def test_an_idle_judge_asks_an_unfinished_round_robins_pairs_early_and_remembers_them():
    """A greedy SCR judge that remembers (`Remembered`): a group's rewards judged in two stages (its first 2
    rollouts, then all 4) equal one judgment of the whole group, and the second stage asks the engine only the pairs
    with the new rollouts; at temperature > 0 it asks everything. The service with `early` asks an unfinished
    cohort's questions while idle, drops those rewards and answers from the whole cohort's call."""
    from rrc_jax.integrations.groups import GroupRewards, Row
    from rrc_jax.judge import Judge
    from rrc_jax.models.char_tokenizer import make_char_tokenizer
    from rrc_jax.service.rewards import Remembered
    from rrc_jax.testing import TextSampler

    tok = make_char_tokenizer()
    verdict = lambda text: "[[A]]" if sum(map(ord, text)) % 3 else "[[B]]"  # noqa: E731

    def scr(sampler, temperature=0.0):
        judge = Judge(sampler, tok, template="toy_pairwise_cot", temperature=temperature, max_new_tokens=16)
        return GroupRewards(judge, "scr", group_size=4, votes=2)

    rows = [Row("3142>", text) for text in ("1234", "4321", "1243", "2134")]
    want = scr(TextSampler(tok, verdict))(rows, step=0)
    inner = TextSampler(tok, verdict)
    remembered = scr(Remembered(inner))
    remembered(rows[:2], step=0, group_size=2)
    first = len(inner.questions)
    np.testing.assert_array_equal(remembered(rows, step=1), want)
    assert first == 2 and len(inner.questions) - first == 6 * 2 - 2 and remembered.judge.sampler.hits == 2
    sampled = TextSampler(tok, verdict)
    again = scr(Remembered(sampled), temperature=1.0)
    again(rows, step=0), again(rows, step=1)
    assert len(sampled.questions) == 2 * 12

    calls = []
    with serving(make_app(rank_judge(calls), poll_s=0.05, early=True)) as url:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            waiting = [pool.submit(post, url, {"rollouts": [rollout(0, k, 4)]}) for k in range(2)]
            while health(url)["early_calls"] == 0:
                time.sleep(0.02)
            waiting += [pool.submit(post, url, {"rollouts": [rollout(0, k, 4)]}) for k in range(2, 4)]
            answers = [w.result(timeout=60) for w in waiting]
        stats = health(url)
    assert calls == [[("g0", 2)], [("g0", 4)]] and stats["early_calls"] == 1 and stats["judged"] == 1
    assert sorted(a["rewards"][0] for _, a in answers) == [0.0, 1.0, 2.0, 3.0]


def nemo_gym_verify(prompt, text, task, rollout):
    """NeMo Gym's verify request (`BaseVerifyRequest`) as its simple agent sends it: the run request (the dataset
    row's own fields beside `responses_create_params`) and the policy's Responses API answer, a reasoning item
    before the assistant's message."""
    return {
        "responses_create_params": {"input": [{"role": "system", "content": "Sort the digits."},
                                              {"role": "user", "content": [{"type": "input_text", "text": prompt}]}],
                                    "temperature": 1.0, "max_output_tokens": 64},
        "response": {"id": f"resp_{task}_{rollout}", "object": "response", "created_at": 0.0, "model": "policy",
                     "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                     "output": [{"type": "reasoning", "id": "rs_0", "summary": [{"type": "summary_text",
                                                                                 "text": "think"}]},
                                {"type": "message", "id": "msg_0", "role": "assistant", "status": "completed",
                                 "content": [{"type": "output_text", "text": text, "annotations": []}]}]},
        "expected_answer": "1234", "_ng_task_index": task, "_ng_rollout_index": rollout,
    }


def test_nemo_gym_verify_calls_get_their_groups_rewards_and_sessions_are_answered():
    """NeMo Gym's resources-server calls: `/seed_session` (its old empty body and its new one with a session id)
    and `/close_session` answered; a group's `/verify` requests in flight at once are answered with the request
    and its `reward` (`BaseVerifyResponse`), the reward its cohort's rank of the assistant's output_text (the
    reasoning item not judged); a response without a message is a 400 naming the field."""
    texts = ["1234", "4321", "1243", "2134"]
    want = [float(sorted(texts).index(x)) for x in texts]
    calls = []
    with serving(make_app(rank_judge(calls), group_size=4, poll_s=0.05)) as url:
        assert post_json(url + "/seed_session", {}) == (200, {})
        seeded = {"resources_session_id": "s-1", "episode_id": {"rollout_id": "0-0", "attempt": 0},
                  "task_id": "0", "task_data": {}}
        assert post_json(url + "/seed_session", seeded) == (200, {"resources_session_id": "s-1"})
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda k: post_json(url + "/verify", nemo_gym_verify("3142", texts[k], 7, k)),
                                    range(4)))
        assert post_json(url + "/close_session", {"resources_session_id": "s-1", "episode_id": {}}) == (
            200, {"resources_session_id": "s-1"})
        body = nemo_gym_verify("3142", "1234", 8, 0)
        body["response"]["output"] = body["response"]["output"][:1]
        status, bad = post_json(url + "/verify", body)
    assert [a for _, a in answers] == [{**nemo_gym_verify("3142", texts[k], 7, k), "reward": want[k]}
                                       for k in range(4)]
    assert calls == [[("system: Sort the digits.\nuser: 3142", 4)]]
    assert status == 400 and bad["error"]["message"].startswith("response.output: no message with output_text")


def test_verl_loads_the_reward_function_by_path_and_its_batch_gets_the_groups_rewards():
    """verl's reward loop: the function loaded from its file by path (`custom_reward_function.path`, as verl does:
    no package import), its reward kwargs merged into each call, every rollout of a batch awaited at once (two
    groups interleaved): each reward is its group's rank; a row without the prompt's text is a KeyError naming
    the key."""
    import asyncio
    import importlib.util

    import rrc_jax.service.remote as remote

    spec = importlib.util.spec_from_file_location("custom_module", remote.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    texts = ["1234", "4321", "1243", "2134"]
    items = [(q, k) for k in range(4) for q in ("3142", "4213")]  # verl's batch: every rollout at once
    calls = []
    with serving(make_app(rank_judge(calls), poll_s=0.05)) as url:
        kwargs = {"url": url, "group_size": 4}  # custom_reward_function.reward_kwargs

        async def batch():
            return await asyncio.gather(*[module.compute_score(
                data_source="sort", solution_str=texts[k] + q, ground_truth="1234",
                extra_info={"split": "train", "index": 0, "question": q}, reward_router_address=None, **kwargs)
                for q, k in items])

        got = asyncio.run(batch())
        with pytest.raises(KeyError, match="extra_info\\['question'\\]: the prompt's text is needed"):
            asyncio.run(module.compute_score("sort", "1234", "1234", {"index": 0}, **kwargs))
    want = [float(sorted(t + q for t in texts).index(texts[k] + q)) for q, k in items]
    assert got == want and sorted(c for call in calls for c in call) == [("3142", 4), ("4213", 4)]


def test_a_key_a_body_limit_and_a_clients_share_guard_the_service():
    """With an API key a request without its bearer token is a 401; a body over the limit a 413; a client with
    `max_client_requests` in flight (one waiting for its cohort) gets a 429 for the next; none is counted."""
    app = make_app(rank_judge([]), api_key="sesame", max_body_bytes=2000, max_client_requests=1, poll_s=0.05)
    one = {"rollouts": [rollout(0, 0, 2)]}
    pool = concurrent.futures.ThreadPoolExecutor(1)
    with serving(app) as url:
        assert post(url, one)[0] == 401
        assert post_json(url + "/v1/rewards", one, headers={"Authorization": "Bearer wrong"})[0] == 401
        big = {"rollouts": [rollout(0, k, 2, completion="x" * 1000) for k in range(2)]}
        status, answer = post_json(url + "/v1/rewards", big, headers={"Authorization": "Bearer sesame"})
        assert status == 413 and "exceed the service's 2000" in answer["error"]["message"]
        waiting = pool.submit(post_json, url + "/v1/rewards", one, headers={"Authorization": "Bearer sesame"})
        while app.state.service.cohorts.stats.rollouts == 0:  # the first is in flight, waiting for its cohort
            time.sleep(0.01)
        status, answer = post_json(url + "/v1/rewards", {"rollouts": [rollout(0, 1, 2)]},
                                   headers={"Authorization": "Bearer sesame"})
        assert status == 429 and "max_client_requests=1" in answer["error"]["message"], answer
        assert not waiting.done()
        stats = app.state.service.health()
        # the peers' trainers send no header of their own: their URL carries the key
        assert post_json(url + "/seed_session?key=sesame", {}) == (200, {})
        assert post_json(url + "/seed_session?key=wrong", {})[0] == 401
        assert post_json(url + "/v1/rewards?key=sesame", one)[0] == 401  # (ours takes the header only)
    pool.shutdown(wait=True)  # the waiting request ends with the server
    assert stats["bad_requests"] == 4 and stats["rollouts"] == 1


def test_sigterm_drains_the_cohorts_in_flight():
    """SIGTERM (the server's `handle_exit`) with 3 of a group's 4 rollouts and 1 of another's waiting: the first
    cohort is judged as a group of 3 and the single rollout answered with an error; every request taken gets its
    answer, then the server stops."""
    calls = []
    app = make_app(rank_judge(calls), poll_s=0.05)
    server = service_server(app)
    with serving(app, server=server) as url:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            waiting = [pool.submit(post, url, {"rollouts": [r]})
                       for r in [rollout(0, k, 4) for k in range(3)] + [rollout(1, 0, 4)]]
            while app.state.service.cohorts.stats.rollouts < 4:
                time.sleep(0.01)
            server.handle_exit(signal.SIGTERM, None)
            answers = [w.result(timeout=60) for w in waiting]
    assert [status for status, _ in answers] == [200] * 4, answers
    assert sorted(a["rewards"][0] for _, a in answers[:3]) == [0.0, 1.0, 2.0] and calls == [[("g0", 3)]]
    assert answers[3][1]["errors"][0].startswith("group 'g1': 1 of its 4 rollouts had arrived when the service "
                                                 "stopped")


def test_a_cohort_that_never_completes_is_judged_as_it_is_or_fails_naming_its_group():
    """After `timeout_s`: a cohort of 2 of its 4 rollouts is judged as it is; one of a single rollout is answered
    with an error naming its group; a judge that raises answers its cohorts' rollouts with its error."""
    calls = []
    with serving(make_app(rank_judge(calls), timeout_s=0.5, poll_s=0.05)) as url:
        status, two = post(url, {"rollouts": [rollout(0, 0, 4), rollout(0, 1, 4)]})
        status_one, one = post(url, {"rollouts": [rollout(1, 0, 4)]})
        stats = health(url)
    assert status == 200 and sorted(two["rewards"]) == [0.0, 1.0] and calls == [[("g0", 2)]]
    assert status_one == 200 and one["rewards"] == [None]
    assert one["errors"][0].startswith("group 'g1': 1 of its 4 rollouts had arrived when 0.5 s passed")
    assert stats["expired"] == 2 and stats["failed"] == 1 and stats["judged"] == 1

    def broken(cohorts):
        raise RuntimeError("the judge is down")

    with serving(make_app(broken, poll_s=0.05)) as url:
        status, answer = post(url, {"rollouts": [rollout(2, k, 2) for k in range(2)]})
    assert status == 200 and answer["rewards"] == [None, None]
    assert answer["errors"] == ["RuntimeError: the judge is down"] * 2


def test_the_service_command_serves_a_recipe_on_the_toy_world(toy_cache, tmp_path):
    """`python -m rrc_jax.service --config=scr.py` (the toy GRM, greedy) rewards a group of 4 sent as two requests;
    AGR without `--anchors`, or with a file that maps a prompt to no list, is one line naming the flag."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    def command(recipe, *extra):
        return [sys.executable, "-m", "rrc_jax.service", f"--config={recipe}", f"--config.toy.cache_dir={toy_cache}",
                f"--port={port}", *extra]

    proc = subprocess.Popen(command("scr.py", "--config.reward.judge.temperature=0"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prompt = SortTask.prompt_text("3142")
    group = [{"prompt": prompt, "completion": c, "group_size": 4, "request_id": str(i)}
             for i, c in enumerate(["1234", "4321", "1243", "2134"])]
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.time() + 300
        while True:
            try:
                health(url)
                break
            except urllib.error.URLError:
                assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
                time.sleep(0.5)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            halves = list(pool.map(lambda part: post(url, {"rollouts": part}), [group[:2], group[2:]]))
        stats = health(url)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert [status for status, _ in halves] == [200, 200], halves
    rewards = halves[0][1]["rewards"] + halves[1][1]["rewards"]
    assert len(rewards) == 4 and all(isinstance(r, float) for r in rewards) and len(set(rewards)) > 1
    assert stats["judged"] == 1 and stats["rollouts"] == 4, stats
    assert "Traceback" not in err, err[-3000:]

    bad = tmp_path / "anchors.json"
    bad.write_text(json.dumps({prompt: "not a list"}))
    cases = [("prc.py", (), "error: --anchors=: reward.kind=prc needs each prompt's reference"),
             ("agr.py", (f"--anchors={bad}",), f"error: --anchors={bad}: prompt "),
             ("agr.py", ("--host=0.0.0.0",), "error: --host=0.0.0.0: listening beyond the loopback needs --api_key")]
    for recipe, extra, message in cases:  # (AGR without --anchors serves: each request then brings them)
        out = subprocess.run(command(recipe, *extra), capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and out.stderr.strip().startswith(message), out.stderr[-2000:]
        assert out.stderr.strip().count("\n") == 0, out.stderr[-2000:]
