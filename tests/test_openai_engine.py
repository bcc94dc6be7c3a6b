"""The HTTP inference engine (`rrc_jax.inference.openai_engine`) against a scripted OpenAI-compatible server on the
loopback address (a bounded request loop): the judge's verdicts through HTTP are the server's answers; a server that
drops, garbles and stalls requests gives abstentions counted exactly while every other verdict stays as it was; a
server that is down, serves another model or is not a completions server ends a run before its first step with one
line; and a step whose requests mostly fail stops the run, naming the failure."""

import json
import socket
import subprocess
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from rrc_jax.config import validate
from rrc_jax.inference.openai_engine import OpenAISampler
from rrc_jax.inference.sampler import SamplingParams
from rrc_jax.judge import Judge, JudgeConfig
from rrc_jax.models.char_tokenizer import make_char_tokenizer

STALL_S, TIMEOUT_S = 8.0, 3.0  # a stall far past the timeout, an answer far within it (on a loaded machine)


def fault_of(ids: list[int]) -> str:
    """What the faulty server does with a prompt, the same at every attempt: 20% dropped, 10% garbage, 10% stalled
    past the client's timeout, the rest answered."""
    h = zlib.crc32(np.asarray(ids, np.int32).tobytes()) % 100
    return "drop" if h < 20 else "garbage" if h < 30 else "stall" if h < 40 else "answer"


def verdict_of(ids: list[int]) -> str:
    """The scripted judge's judgment of a question: a verdict that depends on the whole question."""
    return "looks right [[A]]" if sum(ids) % 3 else "[[B]]"


HTML = b"<html><body>It works!</body></html>"


class Server:
    """A scripted OpenAI-compatible server on 127.0.0.1 serving the model `scripted`, for at most `max_requests`
    completions. `mode`: `clean` answers every question; `short` leaves a choice out of each answer; `faults` drops,
    garbles and stalls some (`fault_of`); `broken` answers the one-token probe (`OpenAISampler.probe`) and fails
    every question with a 500; `html` answers everything with a web page (status 200). `log` holds (prompt ids, what
    it did) per prompt of a completion request (a faulty server does to a request what its first prompt asks),
    `kinds` what it did per request."""

    def __init__(self, faults: bool = False, max_requests: int = 2000, mode: str | None = None):
        self.mode = mode or ("faults" if faults else "clean")
        self.log, self.kinds, self.max_requests, self.stop = [], [], max_requests, False
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, payload: bytes, status: int = 200, kind: str = "application/json"):
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the client gave up on a stalled request
                    pass

            def do_GET(self):
                if owner.mode == "html":
                    return self.reply(HTML, kind="text/html")
                self.reply(json.dumps({"object": "list", "data": [{"id": "scripted", "object": "model"}]}).encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
                ids = prompts[0]  # (a faulty server's fault: its first prompt's)
                question = len(ids) > 1  # (the probe asks one token)
                what = {"faults": fault_of(ids) if question else "answer", "broken": "fail" if question else "answer",
                        "html": "html"}.get(owner.mode, "answer")
                owner.log.extend((tuple(p), what) for p in prompts)
                owner.kinds.append(what)
                if what == "drop":
                    self.close_connection = True
                    return
                if what == "stall":
                    time.sleep(STALL_S)
                if what in ("html", "fail"):
                    return self.reply(HTML, kind="text/html") if what == "html" else self.reply(b"oops", 500)
                n = body.get("n", 1)
                answers = [{"index": k * n + j, "text": verdict_of(p), "finish_reason": "stop"}
                           for k, p in enumerate(prompts) for j in range(n)][::-1]  # (any order: by index)
                if owner.mode == "short" and question:
                    answers = answers[1:]  # a choice missing
                self.reply(b"{not json" if what == "garbage" else json.dumps({"choices": answers}).encode())

        class Httpd(ThreadingHTTPServer):
            request_queue_size = 64  # the client's concurrency, and more

        self.httpd = Httpd(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads, self.httpd.timeout = True, 0.05
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def _loop(self):
        while not self.stop and len(self.kinds) < self.max_requests:
            self.httpd.handle_request()  # returns after `timeout` when no request comes

    def close(self):
        self.stop = True
        self.thread.join(timeout=5)
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def tokenizer():
    return make_char_tokenizer()


class Recording(OpenAISampler):
    """The engine, keeping each call's questions' token ids in question order (`asked`)."""

    def complete(self, prefixes, suffixes, params=SamplingParams(), rng=0, **kw):
        self.asked = [tuple(prefixes[p]) + tuple(s) for p, s in suffixes]
        return super().complete(prefixes, suffixes, params, rng, **kw)


def _judge(server, tokenizer):
    sampler = Recording(None, tokenizer, role="grm", url=server.url, api_model="scripted", timeout_s=TIMEOUT_S,
                        retries=1, backoff_s=0.01, concurrency=8, prompts_per_request=1)  # a fault a question
    return Judge(sampler, tokenizer, JudgeConfig(template="toy_pairwise_cot", max_new_tokens=32, temperature=0.0))


def _pairs(n=24, seed=0):
    rng = np.random.default_rng(seed)
    digits = lambda k: "".join(map(str, rng.integers(0, 10, k)))  # noqa: E731
    prompts = [digits(5) + ">" for _ in range(n)]
    return prompts, [digits(5) for _ in range(n)], [digits(5) for _ in range(n)]


def _explained(faults: bool, tokenizer, pairs):
    """(the judge, its votes and judgments of `pairs`, 2 votes each with the A/B swap, the server) over HTTP."""
    with Server(faults) as server:
        judge = _judge(server, tokenizer)
        votes, log = judge.explain(*pairs, votes=2, swap=True)
    return judge, votes, log, server


def test_verdicts_over_http_are_the_servers_and_faults_are_counted_abstentions(tokenizer):
    pairs = _pairs()
    prompts = pairs[0]
    judge, votes, log, clean = _explained(False, tokenizer, pairs)
    asked = judge.sampler.asked
    assert len(asked) == len(prompts) * 2 and sorted(asked) == sorted(ids for ids, _ in clean.log)
    assert [v.text for v in log] == [verdict_of(list(ids)) for ids in asked]  # each the server's answer to it
    assert judge.metrics.abstains == 0 and (votes.wins + votes.losses == 2).all()
    assert judge.summary()["failed_requests"] == 0 and judge.summary()["timeouts"] == 0

    judge2, votes2, log2, faulty = _explained(True, tokenizer, pairs)
    assert judge2.sampler.asked == asked
    kinds = [fault_of(list(ids)) for ids in asked]
    bad, stalled = sum(k != "answer" for k in kinds), kinds.count("stall")
    assert 0 < stalled < kinds.count("drop") + stalled < bad < len(asked)  # every kind of fault happens here
    s = judge2.summary()
    assert judge2.metrics.abstains == bad == s["failed_requests"]  # exactly the questions left unanswered
    assert s["timeouts"] == stalled
    # each unanswered question was asked twice (one retry, failing again); a request the loopback drops under load
    # is retried too, and answered then
    assert judge2.sampler.stats.retries >= bad and len(faulty.log) >= len(asked) + bad
    # nothing else changes: every answered question has the clean run's verdict, the others none
    assert [v.text for v in log2] == [v.text if k == "answer" else "" for v, k in zip(log, kinds)]
    assert (votes2.wins + votes2.losses + votes2.abstains == 2).all()
    assert (votes2.wins <= votes.wins).all() and (votes2.losses <= votes.losses).all()


def test_a_request_carries_many_questions_and_an_incomplete_answer_fails_them_all(tokenizer):
    """With `prompts_per_request=5` the judge's questions (a pair's two votes: one in each order) go out five to a
    request and come back to their rows with the verdicts of one question a request; an answer short of a choice
    is a garbled request: its rows unanswered, abstentions."""
    pairs = _pairs(n=7)
    one, votes_one, log_one, _ = _explained(False, tokenizer, pairs)

    def judge(server):
        sampler = OpenAISampler(None, tokenizer, url=server.url, api_model="scripted", timeout_s=5.0, retries=0,
                                prompts_per_request=5)
        return Judge(sampler, tokenizer, JudgeConfig(template="toy_pairwise_cot", max_new_tokens=32,
                                                     temperature=0.0))

    with Server() as server:
        batched = judge(server)
        votes, log = batched.explain(*pairs, votes=2, swap=True)
    assert server.kinds == ["answer"] * 3  # 14 questions in requests of 5, 5 and 4
    assert [v.text for v in log] == [v.text for v in log_one]
    assert (votes.wins == votes_one.wins).all() and batched.sampler.stats.calls == 3
    with Server(mode="short") as short:
        broken = judge(short)
        votes, log = broken.explain(*pairs, votes=2, swap=True)
    s = broken.sampler.stats
    assert (s.failed, s.garbled, s.unanswered) == (3, 3, 14) and (votes.abstains == 2).all()


def test_complete_marks_the_questions_it_left_unanswered(tokenizer):
    """`last_failed` marks, in question order, the questions of the last `complete` call whose request failed after
    its retries (a question asked twice: both askings), greedy or sampled; a call answered whole marks none."""
    with Server(mode="short") as short:  # a one-token prompt answered whole, any other short of a choice
        sampler = OpenAISampler(None, tokenizer, url=short.url, timeout_s=5.0, retries=1, backoff_s=0.01,
                                prompts_per_request=1)
        prefixes, suffixes = [[], [7]], [(0, [5]), (0, [5, 6]), (1, []), (0, [5, 6])]
        for temperature in (0.0, 1.0):
            out = sampler.complete(prefixes, suffixes, SamplingParams(temperature, max_new_tokens=16))
            assert sampler.last_failed.tolist() == [False, True, False, True]
            assert (out.lengths > 0).tolist() == [True, False, True, False]
        sampler.complete(prefixes, [(1, []), (0, [9])], SamplingParams(0.0, max_new_tokens=16))
    assert sampler.last_failed.tolist() == [False, False]


def test_generate_keeps_groups_and_marks_what_the_server_cut(tokenizer):
    """`generate` asks once per prompt with `n` = the group size; a row the server finished ends with the stop
    token, one cut at `max_tokens` is truncated; a failed prompt leaves its G rows empty."""

    with Server(faults=False) as server:
        sampler = OpenAISampler(None, tokenizer, url=server.url, timeout_s=2.0, retries=0)
        out = sampler.generate([[1, 5, 6], [1, 7]], group_size=3, params=SamplingParams(0.0, max_new_tokens=32))
    assert sorted(len(ids) for ids, _ in server.log) == [2, 3] and out.tokens.shape == (6, 32)  # in any order
    texts = [tokenizer.decode(t[:n - 1].tolist()) for t, n in zip(out.tokens, out.lengths)]
    assert texts == [verdict_of([1, 5, 6])] * 3 + [verdict_of([1, 7])] * 3
    assert (out.tokens[np.arange(6), out.lengths - 1] == tokenizer.eos_token_id).all() and not out.truncated.any()

    with Server(faults=False) as short:
        sampler = OpenAISampler(None, tokenizer, url=short.url, timeout_s=2.0, retries=0)
        out = sampler.generate([[1, 5, 6]], group_size=1, params=SamplingParams(0.0, max_new_tokens=4))
    assert out.lengths.tolist() == [4] and out.truncated.tolist() == [True]

    dead = OpenAISampler(None, tokenizer, url="http://127.0.0.1:9", timeout_s=1.0, retries=1, backoff_s=0.01)
    out = dead.generate([[1, 5]], group_size=2, params=SamplingParams(0.0, max_new_tokens=8))
    assert out.lengths.tolist() == [0, 0] and dead.stats.failed == 1 and dead.stats.retries == 1


def test_what_the_engine_cannot_do_is_said(tokenizer):
    with pytest.raises(NotImplementedError, match="engine=jax"):
        OpenAISampler(None, tokenizer, url="http://127.0.0.1:9").next_token_logprobs([[1]], [(0, [])], [4, 5])
    with pytest.raises(ValueError, match="url is empty"):
        OpenAISampler(None, tokenizer)
    with pytest.raises(TypeError, match="unknown options chunk"):
        OpenAISampler(None, tokenizer, url="http://127.0.0.1:9", chunk=3)
    assert OpenAISampler(None, tokenizer, url="http://x", max_batch=8, prefix_reuse=True).update_weights(None) == 0


def test_the_config_puts_the_judge_on_the_server_and_the_rollout_on_jax(tokenizer):
    """`inference.engine=openai` builds the judge's sampler over HTTP (with the config's server settings and the
    model's stop tokens and context length) while the rollout and the reference stay on the JAX engine; a server
    without a URL, or bad request settings, is a one-line config error."""
    from flax import nnx

    from rrc_jax.config import base_config, validate
    from rrc_jax.errors import ConfigError
    from rrc_jax.inference import JaxSampler, make_sampler
    from rrc_jax.models import Decoder, DecoderConfig
    from rrc_jax.sharding import model_context

    config = base_config("agr")
    config.inference.engine = "openai"
    with pytest.raises(ConfigError, match=r"^config.inference.url: empty; the openai engine asks a server"):
        validate(config)
    config.inference.url, config.inference.api_model, config.inference.timeout_s = "http://127.0.0.1:9", "grm", 5.0
    validate(config)
    cfg = DecoderConfig(model_type="llama", vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                        num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=300,
                        bos_token_id=1, eos_token_ids=(2, 5), pad_token_id=0)
    with model_context(None):
        model = Decoder(cfg, rngs=nnx.Rngs(0))
    judge = make_sampler("grm", model, tokenizer, engine=config.inference, max_batch=8)
    assert isinstance(judge, OpenAISampler) and judge.url == "http://127.0.0.1:9"
    assert (judge.api_model, judge.timeout_s, judge.retries, judge.concurrency) == ("grm", 5.0, 2, 16)
    assert judge.stop_token_ids == (2, 5) and judge.context_length == 300
    for role in ("policy", "reference"):
        assert isinstance(make_sampler(role, model, tokenizer, engine=config.inference, max_batch=8), JaxSampler)
    for field, value, message in (("concurrency", 0, "0 must be >= 1"), ("retries", -1, "-1 must be >= 0"),
                                  ("timeout_s", 0.0, "0.0 must be > 0")):
        bad = base_config("agr")
        bad.inference.engine, bad.inference.url = "openai", "http://127.0.0.1:9"
        bad.inference[field] = value
        with pytest.raises(ConfigError, match=rf"^config.inference.{field}: {message}"):
            validate(bad)


def test_a_run_whose_judge_server_fails_finishes_and_counts_each_failure(tmp_path, toy_cache):
    """The main job (SCR, 2 steps) with `inference.engine=openai` against the faulty server: the run finishes, and
    each step's `judge/failed_requests` and `judge/timeouts` add up to the questions the server left unanswered
    and stalled (each asked twice: one retry)."""
    from conftest import read_metrics, tiny_config

    from rrc_jax.rl.trainer import run

    with Server(faults=True) as server:
        workdir = run(validate(tiny_config("scr", tmp_path / "run", toy_cache, **{
            "inference.engine": "openai", "inference.url": server.url, "inference.api_model": "scripted",
            "inference.timeout_s": TIMEOUT_S, "inference.retries": 1, "eval.judge_votes": 0,
            # 40% of the questions fail: a step may pass the default half; a fault a question
            "inference.max_failed_fraction": 0.9, "inference.prompts_per_request": 1})))
    rows = read_metrics(workdir)
    assert sorted(rows) == [0, 1, 2]
    kinds = server.kinds  # a request a question: a failing question's two attempts both fail
    failed = sum(rows[s]["judge/failed_requests"] for s in (1, 2))
    assert 2 * failed == sum(k != "answer" for k in kinds) and failed > 0
    assert 2 * sum(rows[s]["judge/timeouts"] for s in (1, 2)) == kinds.count("stall") > 0
    for s in (1, 2):
        assert rows[s]["judge/abstain_rate"] * rows[s]["judge/questions"] >= rows[s]["judge/failed_requests"]


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_run(tmp_path, toy_cache, url: str, api_model: str = "scripted", **overrides):
    """A tiny SCR run's config whose judge is the server at `url` (no retries: a failure is final at once)."""
    from conftest import tiny_config

    return tiny_config("scr", tmp_path, toy_cache, **{
        "inference.engine": "openai", "inference.url": url, "inference.api_model": api_model,
        "inference.retries": 0, "eval.judge_votes": 0, **overrides})


def test_a_judge_server_that_is_down_wrong_or_lying_ends_the_run_before_its_first_step(tmp_path, toy_cache):
    """A run pointed at a malformed URL, at nothing, at a server of another model, or at a web page (status 200)
    ends before step 0 with one line naming the URL, the model and what came back; the command line prints it as
    `error:` and exits 1."""
    from conftest import cli_args

    from rrc_jax.errors import ConfigError
    from rrc_jax.rl.trainer import run

    def refused(name: str, url: str, api_model: str = "scripted") -> str:
        workdir = tmp_path / name
        with pytest.raises(ConfigError) as e:
            run(validate(served_run(workdir, toy_cache, url, api_model)))
        assert "\n" not in str(e.value) and not (workdir / "metrics.jsonl").exists()
        return str(e.value)

    assert refused("malformed", "htp:/127.0.0.1") == ("config.inference.url: 'htp:/127.0.0.1' is not an http(s) URL "
                                                     "with a host; give the server's base URL, e.g. "
                                                     "http://10.0.0.2:8000")
    nothing = f"http://127.0.0.1:{free_port()}"
    assert refused("nothing", nothing).startswith(
        f"the judge server {nothing} (model 'scripted'): GET /v1/models: connection refused; start the server")
    with Server() as server:
        assert refused("wrong", server.url, "judge") == (
            f"the judge server {server.url} (model 'judge'): the server serves 'scripted', not 'judge'; set "
            "config.inference.api_model to one of them")
    with Server(mode="html") as server:
        assert refused("html", server.url) == (
            f"the judge server {server.url} (model 'scripted'): GET /v1/models: a body that is not JSON: "
            "'<html><body>It works!</body></html>'; is config.inference.url the base URL of an OpenAI-compatible "
            "server?")

    out = subprocess.run(cli_args(tmp_path / "cli", toy_cache, kind="scr", **{
        "inference.engine": "openai", "inference.url": nothing, "inference.retries": 0, "eval.judge_votes": 0}),
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(
        f"error: the judge server {nothing} (model '(the server default)'): GET /v1/models: connection refused")


def test_a_step_whose_requests_mostly_fail_stops_the_run_with_the_failure_named(tmp_path, toy_cache):
    """A server that answers the start-up probe, then fails every question: a 1-step run stops at step 1 (exit 3)
    with one line naming the server, the count and the kind, not the abstention alarm that blames the template,
    and exports no policy."""
    from conftest import cli_args

    workdir = tmp_path / "run"
    with Server(mode="broken") as server:
        out = subprocess.run(cli_args(workdir, toy_cache, kind="scr", **{
            "steps": 1, "inference.engine": "openai", "inference.url": server.url, "inference.retries": 0,
            "eval.judge_votes": 0}), capture_output=True, text=True, timeout=300)
    requests = server.kinds.count("fail")
    assert out.returncode == 3 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1] == (
        f"stopped: step 1: the judge server {server.url} left {requests} of {requests} requests of the step's "
        f"judging unanswered (another HTTP error: {requests}), more than inference.max_failed_fraction=0.5; the "
        "step is not saved: once the server answers, rerun the same command to resume from the last checkpoint")
    # the step's one call: 4 x 6 pairs x 2 orders (fewer where a group repeats a response: a question asked with a
    # larger n), up to 32 questions with one n a request
    questions = sum(1 for _, what in server.log if what == "fail")
    assert 0 < questions <= 48 and 0 < requests < questions
    assert "reward.judge.template is the format" not in out.stderr
    assert f"warning: step 1: the judge server left {requests} of {requests} requests unanswered" in out.stderr
    assert not (workdir / "hf_export").exists() and not (workdir / "checkpoints" / "1").exists()


def test_every_request_counter_is_summed_over_hosts():
    """A step's requests and failures are totals over hosts (the stop compares them), and the stop names each
    kind with its count."""
    from rrc_jax.distributed import summed
    from rrc_jax.inference.openai_engine import HttpStats, failure_text

    stats = HttpStats(calls=10, failed=5, refused=3, timeouts=2, endpoints=[[6, 3, 1], [4, 2, 0]])
    assert "endpoint1_failed" in stats.failures() and all(summed(f"judge/{k}") for k in stats.failures())
    assert failure_text(stats.failures()) == "connection refused: 3, timed out: 2"
