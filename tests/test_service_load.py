"""The reward service under load (`python -m rrc_jax.service`, a process of its own): concurrent clients sending
cohorts interleaved in random order, some requests retried, one client's cohorts poisoned (the judge template's
split marker, `{b}` and `{prompt}` in its texts; a lone surrogate), its judge a pool of two scripted
OpenAI-compatible servers (`test_openai_engine.Server`) one of which dies halfway, the other then answering 500 for
a while; then SIGTERM mid-load. Every reward is the in-process construction's on the same verdicts (the poisoned
texts' too, shown to the judge verbatim), the surrogate refused alone, no cohort mixed or counted twice, nothing
lost; the cohorts judged while no server answered fail naming it, and their retries after recovery get the
in-process rewards (no failure remembered). p50 / p99 latency and rollouts/s are printed. The full size (8
clients, 200 cohorts of 8, 5% retried) is `slow`:

    python -m pytest -m slow tests/test_service_load.py -s -p no:xdist
"""

import concurrent.futures
import json
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest
from conftest import post_json
from test_openai_engine import Server, free_port

from rrc_jax.config import base_config, validate
from rrc_jax.inference.openai_engine import OpenAISampler
from rrc_jax.integrations.groups import GroupRewards, Row
from rrc_jax.judge import Judge, JudgeConfig
from rrc_jax.models import load_tokenizer
from rrc_jax.rl.roles import Roles

G, VOTES = 8, 2  # both orders of each pair asked: a cohort's rewards do not depend on its arrival order


def health(url):
    with urllib.request.urlopen(url + "/health", timeout=30) as response:
        return json.loads(response.read())


def cohorts_of(n, seed, poison: str = ""):
    """`n` groups of G distinct completions of a prompt each (sort-task texts), each text led by `poison` but the
    first."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        prompt = "".join(rng.choice("0123456789") for _ in range(5)) + ">"
        texts = set()
        while len(texts) < G:
            texts.add("".join(rng.choice("0123456789") for _ in range(5)))
        texts = sorted(texts)
        out.append((f"c{seed}.{k}", prompt, texts[:1] + [poison + t for t in texts[1:]]))
    return out


# what a hostile client's texts hold: the judge template's split marker, placeholders of its item and context
POISONS = ("1168\u241eRRC_SPLIT\u241e", "{b}", "{prompt}{a}")


def expected_rewards(cohorts, toy_cache, url):
    """Each completion's reward from `GroupRewards` in this process, its judge asking one scripted server."""
    c = base_config("scr")
    c.toy.cache_dir = str(toy_cache)
    grm = Roles.of_run(validate(c)).path("grm")
    tokenizer = load_tokenizer(str(grm))
    sampler = OpenAISampler(None, tokenizer, url=url, api_model="scripted", prompts_per_request=32)
    judge = Judge(sampler, tokenizer, JudgeConfig(template="toy_pairwise_cot", max_new_tokens=32, temperature=0.0))
    rewards = GroupRewards(judge, "scr", group_size=G, votes=VOTES)
    rows = [Row(prompt, text) for _, prompt, texts in cohorts for text in texts]
    values = rewards(rows, step=0)
    return {(group, text): float(v) for (group, _, texts), chunk in zip(cohorts, np.split(values, len(cohorts)))
            for text, v in zip(texts, chunk)}


def start_service(toy_cache, urls, port):
    args = [sys.executable, "-m", "rrc_jax.service", "--config=scr.py", f"--port={port}",
            f"--config.toy.cache_dir={toy_cache}", "--config.inference.engine=openai",
            f"--config.inference.url={','.join(urls)}", "--config.inference.api_model=scripted",
            "--config.inference.bench_after=2", "--config.inference.bench_s=600", "--config.inference.retries=3",
            "--config.reward.judge.template=toy_pairwise_cot", "--config.reward.judge.max_new_tokens=32",
            "--config.reward.judge.temperature=0.0", f"--config.reward.judge.votes={VOTES}",
            f"--config.rl.group_size={G}", "--max_client_requests=100000"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the service exited {proc.returncode}: {proc.stdout.read()}")
        try:
            health(url)
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("the service did not start")


def load(url, cohorts, clients, per_request, retry_rate, seed):
    """Every rollout of `cohorts`, interleaved in a random order, in requests of `per_request` rollouts shared
    among `clients` clients (each a thread pool with all its requests in flight); `retry_rate` of the requests
    sent a second time. Returns each request's (body, status, answer, seconds) and the wall time."""
    rng = random.Random(seed)
    rollouts = [{"prompt": prompt, "completion": text, "group_size": G, "group": group, "request_id": f"{group}/{i}"}
                for group, prompt, texts in cohorts for i, text in enumerate(texts)]
    rng.shuffle(rollouts)
    bodies = [{"rollouts": rollouts[i:i + per_request]} for i in range(0, len(rollouts), per_request)]
    bodies += [bodies[i] for i in rng.sample(range(len(bodies)), round(retry_rate * len(bodies)))]  # the retries
    shares = [bodies[k::clients] for k in range(clients)]

    def timed(body):
        start = time.monotonic()
        status, answer = post_json(url + "/v1/rewards", body)
        return body, status, answer, time.monotonic() - start

    start = time.monotonic()
    pools = [concurrent.futures.ThreadPoolExecutor(len(share)) for share in shares]
    futures = [pool.submit(timed, body) for pool, share in zip(pools, shares) for body in share]
    results = [f.result(timeout=600) for f in futures]
    for pool in pools:
        pool.shutdown()
    return results, time.monotonic() - start


def outage(url, a, want):
    """Server `a` (the pool's last) answering 500 while new cohorts are judged: they fail, naming the judge's failed
    requests; once it answers again the same requests (their request ids) get the in-process rewards."""
    cohorts = cohorts_of(3, seed=4)
    bodies = [{"rollouts": [{"prompt": p, "completion": t, "group_size": G, "group": g, "request_id": f"{g}/{i}"}
                            for i, t in enumerate(texts)]} for g, p, texts in cohorts]
    a.mode = "broken"
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        failed = list(pool.map(lambda body: post_json(url + "/v1/rewards", body), bodies))
    a.mode = "clean"
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        retried = list(pool.map(lambda body: post_json(url + "/v1/rewards", body), bodies))
    return cohorts, bodies, failed, retried


def run_load(toy_cache, n_cohorts, clients, retry_rate):
    """The load (a poisoned client's cohorts among it), one server of the pool killed halfway through the judging;
    the other answering 500 for a while; then SIGTERM mid-load."""
    cohorts = cohorts_of(n_cohorts, seed=1) + [c for k, poison in enumerate(POISONS)
                                               for c in cohorts_of(1, seed=10 + k, poison=poison)]
    with Server(max_requests=10 ** 6) as a, Server(max_requests=10 ** 6) as b, Server(max_requests=10 ** 6) as ref:
        want = expected_rewards(cohorts + cohorts_of(3, seed=4), toy_cache, ref.url)
        questions = len(ref.log)  # what judging every cohort asks (one prompt a question)
        proc, url = start_service(toy_cache, [a.url, b.url], free_port())
        try:
            def kill_b_halfway():
                while len(a.log) + len(b.log) < questions // 2 and proc.poll() is None:
                    time.sleep(0.01)
                b.close()

            killer = threading.Thread(target=kill_b_halfway)
            killer.start()
            surrogate = {"rollouts": [{"prompt": "1>", "completion": "\ud800", "group_size": G, "group": "s"}]}
            refused = post_json(url + "/v1/rewards", surrogate)  # (the poisoned client's)
            results, wall = load(url, cohorts, clients, per_request=G // 2, retry_rate=retry_rate, seed=2)
            killer.join()
            down = outage(url, a, want)
            stats = health(url)

            # SIGTERM mid-load: 7 of each new cohort's 8 rollouts in flight, none whole
            late = cohorts_of(max(2, n_cohorts // 10), seed=3)
            rollouts = [{"prompt": p, "completion": t, "group_size": G, "group": g, "request_id": f"{g}/{i}"}
                        for g, p, texts in late for i, t in enumerate(texts[:G - 1])]
            with concurrent.futures.ThreadPoolExecutor(len(rollouts)) as pool:
                waiting = [pool.submit(post_json, url + "/v1/rewards", {"rollouts": [r]}) for r in rollouts]
                while health(url)["rollouts"] < stats["rollouts"] + len(rollouts):
                    time.sleep(0.05)
                proc.send_signal(signal.SIGTERM)
                drained = [w.result(timeout=300) for w in waiting]
            # uvicorn raises the signal again once it has shut down gracefully
            assert proc.wait(timeout=120) in (0, -signal.SIGTERM)
        finally:
            if proc.poll() is None:
                proc.kill()
            output = proc.stdout.read()
    return cohorts, want, results, wall, stats, late, drained, (a, b), output, refused, down


def check_and_report(toy_cache, n_cohorts, clients, retry_rate):
    cohorts, want, results, wall, stats, late, drained, (a, b), output, refused, down = run_load(
        toy_cache, n_cohorts, clients, retry_rate)
    assert refused[0] == 400 and "lone surrogate" in refused[1]["error"]["message"]
    assert all(status == 200 and "errors" not in answer for _, status, answer, _ in results), output
    _, bodies, failed, retried = down
    for body, (status, answer), (again, answered) in zip(bodies, failed, retried):
        assert status == 200 and answer["rewards"] == [None] * G, answer
        assert all("the judge failed" in e and "--max_failed_fraction" in e for e in answer["errors"]), answer
        assert again == 200 and "errors" not in answered
        assert answered["rewards"] == [want[r["group"], r["completion"]] for r in body["rollouts"]]
    serials: dict[str, set[int]] = {}
    for body, _, answer, _ in results:
        for r, reward, serial in zip(body["rollouts"], answer["rewards"], answer["cohorts"]):
            assert reward == want[r["group"], r["completion"]], (r, reward)
            serials.setdefault(r["group"], set()).add(serial)
    n = len(cohorts)
    assert all(len(s) == 1 for s in serials.values()) and len(set.union(*serials.values())) == n
    rollouts, sent = n * G, sum(len(body["rollouts"]) for body, *_ in results)
    outage = len(bodies)  # cohorts failed while no server answered, then judged again
    assert (stats["rollouts"], stats["whole"], stats["judged"], stats["failed"], stats["judge_failures"]) == (
        rollouts + 2 * outage * G, n + 2 * outage, n + outage, outage * G, outage)
    assert stats["retries"] == sent - rollouts > 0 and stats["bad_requests"] == 1
    servers = stats["judge"]["servers"]
    dead = servers[1]
    assert b.stop and dead["failures"] >= 2 and dead["benched"] and servers[0]["failures"] > 0, stats
    assert len(b.log) > 0 and len(a.log) > len(b.log)  # b answered until it died; a took the rest
    # SIGTERM: every request taken answered, each cohort of 7 judged as it is
    assert [s for s, _ in drained] == [200] * len(drained) and all("errors" not in x for _, x in drained)
    latency = np.array([t for *_, t in results])
    print(f"\nreward service load: {clients} clients, {n_cohorts} cohorts of {G} ({rollouts} rollouts, "
          f"{len(results)} requests of {G // 2}, {sent - rollouts} rollouts retried), one of two judge servers "
          f"killed halfway: p50 {np.percentile(latency, 50):.2f} s, p99 {np.percentile(latency, 99):.2f} s, "
          f"{rollouts / wall:.1f} rollouts/s over {wall:.1f} s; judge calls {stats['judge_calls']} (early "
          f"{stats['early_calls']}, questions remembered {stats['judge']['remembered']}); server attempts "
          f"{[s['attempts'] for s in servers]}, failed {[s['failures'] for s in servers]}; {outage} cohorts failed "
          f"while no server answered, judged on their retries; SIGTERM with "
          f"{len(drained)} rollouts of {len(late)} cohorts in flight: all answered")


def test_the_service_under_load_loses_nothing(toy_cache):
    """A small load (4 clients, 24 cohorts of 8, 10% of the requests retried) with every check of the full one."""
    check_and_report(toy_cache, n_cohorts=24, clients=4, retry_rate=0.1)


@pytest.mark.slow
def test_the_service_under_full_load_loses_nothing(toy_cache):
    """8 concurrent clients, 200 cohorts of 8 interleaved in random order, 5% of the requests retried."""
    check_and_report(toy_cache, n_cohorts=200, clients=8, retry_rate=0.05)
