"""A judge pool (`rrc_jax.inference.pool`): attempts spread by load, a failed request retried on another server, a
server that keeps failing benched and probed again later; through the HTTP engine, two scripted servers answer as
one, and one of them dying halfway loses nothing: its requests are served by the other, counted per server."""

import numpy as np
import pytest
from test_openai_engine import Server, _pairs, verdict_of

from rrc_jax.config import base_config, validate
from rrc_jax.errors import ConfigError
from rrc_jax.inference.openai_engine import OpenAISampler
from rrc_jax.inference.pool import EndpointPool
from rrc_jax.judge import Judge, JudgeConfig
from rrc_jax.models.char_tokenizer import make_char_tokenizer


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_attempts_go_to_the_least_loaded_server_and_a_failing_one_is_benched_then_probed():
    clock = Clock()
    pool = EndpointPool(["http://a", "http://b", "http://c"], bench_after=2, bench_s=10.0, clock=clock)
    held = [pool.acquire() for _ in range(5)]  # the fewest in flight, then the fewest sent, then the first
    assert [e.url for e in held] == ["http://a", "http://b", "http://c", "http://a", "http://b"]
    for e in held:
        pool.release(e, ok=True)
    a = pool.acquire(avoid={"http://c"})
    assert a.url == "http://a" and not pool.release(a, ok=False)  # one failure: still in play
    retry = pool.acquire(avoid={"http://a"})  # the retry goes elsewhere
    assert retry.url == "http://c"
    pool.release(retry, ok=True)
    a = pool.acquire(avoid={"http://b", "http://c"})
    assert a.url == "http://a" and pool.release(a, ok=False)  # two in a row: benched
    busy = [pool.acquire() for _ in range(4)]
    assert sorted(e.url for e in busy) == ["http://b", "http://b", "http://c", "http://c"]
    clock.now += 10.0  # its bench is over: its next attempt is the probe
    probe = pool.acquire()
    assert probe.url == "http://a" and pool.release(probe, ok=False)  # failed again: benched again at once
    assert pool.health()[0] == {"url": "http://a", "in_flight": 0, "benched": True, "attempts": 5, "failures": 3,
                                "benchings": 2}
    for e in busy:
        pool.release(e, ok=True)
    for e in pool.endpoints[1:]:  # every server benched: the one whose bench ends first is asked, never nothing
        e.benched_until = clock.now + 50.0
    assert pool.acquire().url == "http://a"
    # an answer to an attempt started before the endpoint's last failure does not clear its bench
    b, c = pool.endpoints[1], pool.endpoints[2]
    b.benched_until = c.benched_until = 0.0
    old = pool.acquire(avoid={"http://a", "http://c"})
    assert old.url == "http://b"
    clock.now += 1.0
    for _ in range(2):
        failed = pool.acquire(avoid={"http://a", "http://c"})
        pool.release(failed, ok=False)
    assert pool.benched(b) and not pool.release(old, ok=True) and pool.benched(b)


def test_a_pool_whose_servers_were_all_down_finds_the_first_that_answers_again():
    """Every server benched: a request's retry goes to a benched server it has not failed on, and a benched server
    that fails again goes to the back of the queue, so the one that came back is found before any bench ends."""
    clock = Clock()
    pool = EndpointPool(["http://dead", "http://back"], bench_after=1, bench_s=600.0, clock=clock)
    for url in ("http://dead", "http://back"):  # both fail: benched, "dead" first
        pool.release(pool.acquire(avoid={"http://dead", "http://back"} - {url}), ok=False)
    clock.now += 1.0
    first = pool.acquire()
    assert first.url == "http://dead" and not pool.release(first, ok=False)
    retry = pool.acquire(avoid={"http://dead"})
    assert retry.url == "http://back"
    pool.release(retry, ok=True)
    assert not pool.benched(pool.endpoints[1]) and pool.acquire().url == "http://back"
    with pytest.raises(ValueError, match="listed twice"):
        EndpointPool(["http://a", "http://a"])


def _judge(urls, tokenizer, **kw):
    sampler = OpenAISampler(None, tokenizer, role="grm", url=urls, api_model="scripted", **{
        "timeout_s": 5.0, "retries": 2, "backoff_s": 0.01, "concurrency": 4, "prompts_per_request": 1,
        "bench_after": 2, "bench_s": 600.0, **kw})
    return Judge(sampler, tokenizer, JudgeConfig(template="toy_pairwise_cot", max_new_tokens=32, temperature=0.0))


def test_two_servers_answer_as_one_and_one_dying_halfway_loses_nothing():
    """Two scripted servers behind one judge: the questions spread over both, every verdict the server's answer;
    then one server dies: the next call's verdicts are the same with no abstention, its failed attempts retried on
    the other, the dead one benched after two failures in a row, each counted per server."""
    tokenizer = make_char_tokenizer()
    pairs = _pairs(n=16)
    with Server() as a, Server() as b:
        judge = _judge(f"{a.url},{b.url}", tokenizer)
        judge.sampler.probe()
        votes, log = judge.explain(*pairs, votes=2, swap=True)
        s = judge.summary()
        assert s["endpoint0_attempts"] > 0 and s["endpoint1_attempts"] > 0
        assert s["endpoint0_attempts"] + s["endpoint1_attempts"] == s["requests"] == 32
        assert len(a.log) + len(b.log) == 32 + 2 and judge.metrics.abstains == 0  # (and each one probe)
        b.close()  # halfway: b is gone
        judge.reset_metrics()
        votes2, log2 = judge.explain(*pairs, votes=2, swap=True)
        s2 = judge.summary()
    assert [v.text for v in log2] == [v.text for v in log] and judge.metrics.abstains == 0
    assert (votes2.wins == votes.wins).all() and (votes2.losses == votes.losses).all()
    assert s2["failed_requests"] == 0 and s2["refused"] == 0  # (a request whose last attempt failed: none)
    assert s2["endpoint1_failed"] == s2["endpoint1_attempts"] >= 2 and s2["endpoint1_benched"] == 1
    assert s2["endpoint0_failed"] == 0 and s2["endpoint0_attempts"] == 32
    assert judge.sampler.stats.retries == s2["endpoint1_failed"]
    assert all(verdict_of(list(ids)) for ids, _ in a.log)
    assert judge.sampler.pool.health()[1]["benched"]


def test_a_server_answering_too_few_choices_is_a_failed_attempt_retried_on_the_other():
    """A pool of two scripted servers, one answering each request of two questions with one choice: each such
    answer is a garbled attempt counted against it, the server is benched after two in a row, and every request is
    answered by the other server, no question left unanswered."""
    tokenizer = make_char_tokenizer()
    pairs = _pairs(n=8)
    with Server() as a, Server(mode="short") as b:
        judge = _judge(f"{a.url},{b.url}", tokenizer, prompts_per_request=2)
        votes, log = judge.explain(*pairs, votes=2, swap=True)
        s = judge.summary()
    assert s["failed_requests"] == s["garbled"] == 0 and judge.metrics.abstains == 0
    assert s["endpoint1_failed"] == s["endpoint1_attempts"] >= 2 and s["endpoint1_benched"] == 1
    assert s["endpoint0_failed"] == 0 and s["endpoint0_attempts"] == s["requests"] == len(a.kinds)
    assert judge.sampler.stats.retries == s["endpoint1_failed"]
    assert len(log) == 16 and all(v.text in ("looks right [[A]]", "[[B]]") for v in log)  # the server's answers


def test_the_config_takes_a_pool_and_the_probe_names_the_server_that_is_down():
    """`inference.url` lists servers comma-separated, each checked; a server listed twice is refused; the probe
    asks every server and names the one that does not answer."""
    tokenizer = make_char_tokenizer()

    def config(url, **fields):
        c = base_config("agr")
        c.inference.engine, c.inference.url = "openai", url
        c.inference.update(fields)
        return validate(c)

    s = config("http://10.0.0.2:8000, http://10.0.0.3:8000/v1", bench_after=5)
    assert s.inference.options("grm")["bench_after"] == 5
    with pytest.raises(ConfigError, match="lists a server twice"):
        config("http://10.0.0.2:8000,http://10.0.0.2:8000/")
    with pytest.raises(ConfigError, match="config.inference.url: 'ftp://x' is not an http"):
        config("http://10.0.0.2:8000,ftp://x")
    with pytest.raises(ConfigError, match="config.inference.bench_after: 0 must be >= 1"):
        config("http://10.0.0.2:8000", bench_after=0)
    with Server() as a:
        dead = a.url.rsplit(":", 1)[0] + ":1"
        judge = _judge([a.url, dead], tokenizer)
        with pytest.raises(ConfigError, match=f"the judge server {dead} .*connection refused"):
            judge.sampler.probe()
    np.testing.assert_equal(judge.sampler.stats.endpoints, [[0, 0, 0], [0, 0, 0]])  # the probe is not a request
