"""The judge served over HTTP (`rrc_jax.inference.server`, `python -m rrc_jax.serve`) and asked through the HTTP
engine on the loopback address: at temperature 0 its verdicts are the in-process judge's; the main job with
`inference.engine=openai` pointed at it gives the in-process run's series without loading the judge's weights, and
stops when the server dies, then resumes to an uninterrupted run's metrics once it is back; the server holds its
own limits (what a request may ask, a large request taking turns with the others, a client that went away)."""

import asyncio
import dataclasses
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from rrc_jax.config import validate
from rrc_jax.inference import SampleOutput, make_sampler
from rrc_jax.inference.server import bind, make_app, serving, uvicorn_server
from rrc_jax.judge import Judge, JudgeConfig
from rrc_jax.models import load_hf, load_tokenizer

JUDGING = JudgeConfig(template="toy_pairwise_cot", max_new_tokens=48, temperature=0.0, seed=0)
PROMPTS = ["3+4=", "12+5=", "7+7=", "9+1=", "2+2=", "30+4="]
RESPONSES = [["7", "8", "6", "7 is it"], ["17", "16", "1 7", "17"], ["14", "15", "41", "13"], ["10", "01", "9", "11"],
             ["4", "5", "22", "3"], ["34", "35", "33", "43"]]


@pytest.fixture(scope="module")
def grm(toy_cache):
    """The toy world's judge: (its directory, model, tokenizer)."""
    from conftest import tiny_config

    from rrc_jax.rl.roles import Roles

    path = Roles.of_run(validate(tiny_config("scr", "unused", toy_cache))).path("grm")
    return path, load_hf(path), load_tokenizer(path)


@pytest.fixture(scope="module")
def served(grm):
    """(the server's URL, its app) serving the toy judge for the module (a bounded request loop)."""
    _, model, tokenizer = grm
    app = make_app(make_sampler("grm", model, tokenizer), tokenizer, served_name="toy-grm", max_batch=64,
                   vocab_size=model.cfg.vocab_size)
    with serving(app, limit_max_requests=5000) as url:
        yield url, app


def post(url, body):
    """(status, JSON answer) of a POST to `url`/v1/completions."""
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_served_verdicts_equal_the_in_process_judges_at_temperature_0(grm, served):
    """Every judgment (text and verdict) of an SCR round robin over 6 groups of 4 asked through the HTTP engine
    with 16 requests in flight is the in-process judge's; the server batched concurrent requests."""
    _, model, tokenizer = grm
    url, app = served
    local = Judge(make_sampler("grm", model, tokenizer), tokenizer, JUDGING)
    remote = Judge(make_sampler("grm", model.cfg, tokenizer, engine={"engine": "openai", "url": url,
                                                                      "concurrency": 16, "prompts_per_request": 1}),
                   tokenizer, JUDGING)  # a request a question: the server batches concurrent requests
    local.trace, remote.trace = [], []
    before = dict(vars(app.state.batcher.stats))
    counts = local.round_robin(PROMPTS, RESPONSES)
    assert (remote.round_robin(PROMPTS, RESPONSES) == counts).all()
    assert remote.trace == local.trace and len(local.trace) == 36
    assert {t["verdict"] for t in local.trace} >= {"A", "B"}  # verdicts both ways
    stats = vars(app.state.batcher.stats)
    requests, batches = stats["requests"] - before["requests"], stats["batches"] - before["batches"]
    order = lambda t: (t["j"], t["i"]) if t["swapped"] else (t["i"], t["j"])
    shown = {(t["prompt"], *(RESPONSES[t["prompt"]][x] for x in order(t))) for t in local.trace}  # a question asked
    # twice (a group holding one response twice) is one request
    assert requests == len(shown) < 36 and batches < requests  # concurrent requests shared engine calls
    assert remote.summary()["failed_requests"] == 0


def test_the_endpoint_takes_texts_ids_and_groups_and_says_what_is_wrong(grm, served):
    _, model, tokenizer = grm
    url, _ = served
    ids = tokenizer("3+4=", add_special_tokens=False).input_ids
    greedy = {"temperature": 0, "max_tokens": 12}
    status, text = post(url, {"prompt": "3+4=", **greedy})
    assert status == 200 and text["model"] == "toy-grm" and len(text["choices"]) == 1
    status, by_ids = post(url, {"prompt": [ids, ids[:-1]], "n": 2, "model": "toy-grm", **greedy})
    assert status == 200 and [c["index"] for c in by_ids["choices"]] == [0, 1, 2, 3]
    assert by_ids["choices"][0]["text"] == by_ids["choices"][1]["text"] == text["choices"][0]["text"]
    out = make_sampler("grm", model, tokenizer).generate([ids], 1, make_params(12))
    n = int(out.lengths[0]) - (0 if out.truncated[0] else 1)
    assert text["choices"][0]["text"] == tokenizer.decode(out.tokens[0, :n].tolist(), skip_special_tokens=True)
    assert text["choices"][0]["finish_reason"] == ("length" if out.truncated[0] else "stop")
    assert text["usage"] == {"prompt_tokens": len(ids), "completion_tokens": int(out.lengths[0]),
                             "total_tokens": len(ids) + int(out.lengths[0])}
    first = text["choices"][0]["text"][:2]
    status, cut = post(url, {"prompt": "3+4=", "stop": first[1:], **greedy})
    assert cut["choices"][0] == {**text["choices"][0], "text": first[:1], "finish_reason": "stop"}

    for body, status, message in (
            ({"prompt": "3+4=", "model": "other"}, 404, "is not served here; this server serves 'toy-grm'"),
            ({"prompt": ""}, 400, "a prompt is empty"),
            ({"prompt": [3.5]}, 400, "'prompt' must be"),
            ({"max_tokens": 4}, 400, "'prompt' is missing"),
            ({"prompt": "1", "logprobs": 2}, 400, "'logprobs' is not applied by this server (got 2)"),
            ({"prompt": "1", "n": 0}, 400, "'n' must be >= 1"),
            ({"prompt": "1", "temperature": -1}, 400, "temperature=-1.0 must be"),
            ({"prompt": "1", "max_tokens": 10_000}, 400, "exceeds the model's context"),
            ({"prompt": [model.cfg.vocab_size + 5]}, 400, "outside the vocabulary")):
        got, answer = post(url, body)
        assert got == status and message in answer["error"]["message"], (body, answer)
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as response:
        assert json.loads(response.read())["data"][0]["id"] == "toy-grm"


def make_params(n):
    from rrc_jax.inference import SamplingParams

    return SamplingParams(temperature=0.0, max_new_tokens=n)


def test_the_main_job_with_the_served_judge_or_the_reward_service_gives_the_in_process_series(
        tmp_path, toy_cache, grm, served, monkeypatch):
    """AGR, 2 steps, the judge greedy, three ways: in process; `inference.engine=openai` pointed at the served toy
    judge; `reward.service_url` pointed at the reward service of the same recipe (`recipe_app`, the command's app,
    on the loopback), AGR's anchors the run's own sent with each rollout. The served judge gives the in-process
    run's judge counts and series, the prompts sent as token ids; the service every metric both runs log (times and its prefill counts aside; the
    judge's counters come back with each request), judging each rollout once. Neither trainer loads the judge's
    weights."""
    from conftest import read_metrics, tiny_config

    import rrc_jax.rl.roles
    from rrc_jax.rl.trainer import run
    from rrc_jax.service.rewards import recipe_app

    url, _ = served
    loaded = []
    real = rrc_jax.rl.roles.load_hf
    monkeypatch.setattr(rrc_jax.rl.roles, "load_hf", lambda path, **kw: loaded.append(path) or real(path, **kw))
    common = {"eval.judge_votes": 0, "reward.judge.max_new_tokens": 48}
    app = recipe_app(validate(tiny_config("agr", tmp_path / "service", toy_cache, **common)), poll_s=0.05)
    runs = {}
    with serving(app) as service:
        for way, overrides in (("jax", {}), ("openai", {"inference.engine": "openai", "inference.url": url}),
                               ("service", {"reward.service_url": service})):
            loaded.clear()
            workdir = run(validate(tiny_config("agr", tmp_path / way, toy_cache, **common, **overrides)))
            runs[way] = (read_metrics(workdir), list(loaded))
    (here, here_loaded), (there, there_loaded) = runs["jax"], runs["openai"]
    rewarded, rewarded_loaded = runs["service"]
    assert grm[0] in here_loaded and grm[0] not in there_loaded and grm[0] not in rewarded_loaded
    assert sorted(here) == sorted(there) == sorted(rewarded) == [0, 1, 2]
    series = lambda rows, key: [rows[s].get(key) for s in sorted(rows)]  # noqa: E731
    assert series(here, "eval/oracle_quality") == series(there, "eval/oracle_quality")
    assert [q for q in series(here, "eval/oracle_quality") if q is not None]
    for key in ("reward/mean", "reward/std", "judge/abstain_rate", "judge/questions", "oracle_quality"):
        assert series(here, key) == series(there, key), key
    assert any(here[s]["reward/std"] > 0 for s in (1, 2))  # verdicts that rank
    assert all(there[s]["judge/failed_requests"] == 0 for s in (1, 2))
    # token ids sent (this server takes them): no prompt went as text, so none was retokenized or counted
    assert not any("judge/retokenized_prompts" in there[s] for s in there)
    for step in here:
        # (the service judges a rollout as it arrives: its engine shares fewer prefixes, so it prefills and decodes
        # in other chunks)
        counters = ("time/", "memory/", "system/", "judge/prefill_", "judge/decode_", "judge/row_steps")
        shared = {k for k in set(here[step]) & set(rewarded[step])
                  if not k.startswith(counters) and k != "tokens_per_second"}
        assert {"reward/mean", "loss", "kl", "oracle_quality", "judge/questions", "judge/abstain_rate"} <= shared \
            or step == 0
        assert {k: rewarded[step][k] for k in shared} == {k: here[step][k] for k in shared}, step
    stats = app.state.service.stats
    assert (stats.judged, stats.failed, app.state.service.cohorts.stats.retries) == (2 * 4 * 4, 0, 0)  # per rollout


def test_the_serve_command_serves_a_checkpoint(grm, tmp_path):
    """`python -m rrc_jax.serve --model=DIR --port=P` (the judge in int8 weights and a float8 KV cache:
    `--weight_qtype`, `--kv_dtype`) answers a completion, and a client that drops mid-body leaves no traceback in
    its log; a bad flag, and a busy port (said before the model loads), are one line."""
    path, _, _ = grm
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "rrc_jax.serve", f"--model={path}", f"--port={port}",
                             "--served_name=judge", "--weight_qtype=int8", "--kv_dtype=float8_e4m3fn"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ask = {"prompt": "3+4=", "max_tokens": 4, "temperature": 0, "model": "judge"}
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.time() + 300
        while True:
            try:
                status, answer = post(url, ask)
                break
            except urllib.error.URLError:
                assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
                time.sleep(0.5)
        assert status == 200 and answer["choices"][0]["finish_reason"] in ("stop", "length")
        with socket.create_connection(("127.0.0.1", port)) as client:  # a body that never comes whole
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 1000\r\n\r\n{\"prompt\": \"3")
        assert post(url, ask)[0] == 200  # still serving
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "Exception" not in err, err[-3000:]

    with socket.socket() as busy:  # held while the command starts: the port is named before the model (missing)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        lines = {}
        procs = {flag: subprocess.Popen([sys.executable, "-m", "rrc_jax.serve", *args], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
                 for flag, args in (("max_batch", [f"--model={path}", "--max_batch=0"]),
                                    ("port", [f"--model={path}", "--port=70000"]),
                                    ("batch_wait_ms", [f"--model={path}", "--batch_wait_ms=nan"]),
                                    ("max_body_mb", [f"--model={path}", "--max_body_mb=0"]),
                                    ("busy", [f"--model={tmp_path / 'absent'}", f"--port={taken}"]))}
        for flag, p in procs.items():
            _, err = p.communicate(timeout=300)
            assert p.returncode == 1 and "Traceback" not in err, err[-2000:]
            lines[flag] = err.strip().splitlines()[-1]
    assert lines["max_batch"] == "error: --max_batch=0: must be >= 1"
    assert lines["port"] == "error: --port=70000: must be in 1-65535"
    assert lines["batch_wait_ms"] == "error: --batch_wait_ms=nan: must be a finite number >= 0"
    assert lines["max_body_mb"] == "error: --max_body_mb=0: must be >= 1"
    assert lines["busy"].startswith(f"error: --host=127.0.0.1 --port={taken}: cannot listen there (")


def test_the_server_refuses_what_it_does_not_apply_and_counts_the_tokens_it_returns(grm, served):
    """A field of the wrong type or out of range, an OpenAI parameter the server does not apply, or a field it does
    not know is a 400 naming it (a neutral value is taken); `usage.completion_tokens` counts the tokens of the texts
    returned: without the stop token, and only up to a stop string."""
    _, model, tokenizer = grm
    url, _ = served
    for body, message in (
            ({"stop_token_ids": [2 ** 70]}, "'stop_token_ids' holds token ids outside the vocabulary [0, 36)"),
            ({"stop_token_ids": [-1]}, "'stop_token_ids' holds token ids outside the vocabulary"),
            ({"stop_token_ids": "2"}, "'stop_token_ids' must be a list of token ids"),
            ({"skip_special_tokens": "no"}, "'skip_special_tokens' must be true or false, got 'no'"),
            ({"n": "2"}, "'n' must be an integer, got '2'"),
            ({"max_tokens": 1.5}, "'max_tokens' must be an integer"),
            ({"temperature": "hot"}, "'temperature' must be a number"),
            ({"top_p": None, "seed": [1]}, "'seed' must be an integer"),
            ({"stop": 5}, "'stop' must be a string or a list"),
            ({"model": 3}, "'model' must be a string"),
            ({"user": 3}, "'user' must be a string"),
            ({"echo": True}, "'echo' is not applied by this server (got True)"),
            ({"best_of": 3}, "'best_of' is not applied by this server (got 3)"),
            ({"presence_penalty": 0.5}, "'presence_penalty' is not applied"),
            ({"frequency_penalty": -1}, "'frequency_penalty' is not applied"),
            ({"suffix": "!"}, "'suffix' is not applied"),
            ({"stream": True}, "'stream' is not applied"),
            ({"tempreature": 0}, "'tempreature' is not a parameter this server knows"),
            ({"n": 10 ** 6, "max_tokens": 100}, "exceeds the 16777216 tokens one request may ask for")):
        status, answer = post(url, {"prompt": "1", **body})
        assert status == 400 and message in answer["error"]["message"], (body, answer)
    neutral = {"echo": False, "best_of": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "suffix": None,
               "logprobs": None, "stream": False, "user": "me"}
    greedy = {"prompt": ["3+4=", "12+5="], "n": 2, "max_tokens": 48, "temperature": 0}
    status, answer = post(url, {**greedy, **neutral})
    assert status == 200 and {c["finish_reason"] for c in answer["choices"]} == {"stop"}  # rows that stopped
    tokens = lambda choices: sum(len(tokenizer(c["text"], add_special_tokens=False).input_ids) for c in choices)
    assert answer["usage"]["completion_tokens"] == tokens(answer["choices"])
    status, cut = post(url, {**greedy, "stop": "[["})
    assert [c["text"] for c in cut["choices"]] == [c["text"].split("[[")[0] for c in answer["choices"]]
    assert cut["usage"]["completion_tokens"] == tokens(cut["choices"]) < answer["usage"]["completion_tokens"]


@pytest.fixture(scope="module")
def small_calls(grm):
    """(URL, app) of the toy judge served with calls of at most 8 rows: a larger request runs as several."""
    _, model, tokenizer = grm
    app = make_app(make_sampler("grm", model, tokenizer, max_batch=8), tokenizer, served_name="toy-grm",
                   max_batch=8, vocab_size=model.cfg.vocab_size)
    with serving(app, limit_max_requests=1000) as url:
        yield url, app


def in_background(url: str, body: dict) -> tuple[threading.Thread, dict]:
    """A thread posting `body` (started); its answer lands in the dict's `answer`."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(answer=post(url, body)), daemon=True)
    thread.start()
    return thread, result


def wait_for(condition, what: str) -> None:
    deadline = time.time() + 120
    while not condition():
        assert time.time() < deadline, what
        time.sleep(0.005)


def test_a_large_request_takes_turns_with_the_others(small_calls):
    """A request of n = 400 rows runs as calls of at most 8 rows; a 1-row request sent while it runs is answered
    after at most one of them, long before it ends."""
    url, app = small_calls
    stats = app.state.batcher.stats
    one = {"prompt": "1+1=", "max_tokens": 4, "temperature": 0}
    assert post(url, one)[0] == 200  # its shape compiled
    before = dataclasses.replace(stats)
    thread, big = in_background(url, {"prompt": "3+4=", "n": 400, "max_tokens": 8, "temperature": 1.0, "seed": 3})
    wait_for(lambda: stats.batches > before.batches, "the large request never started")
    status, _ = post(url, one)
    answered_at = stats.rows - before.rows
    assert status == 200 and thread.is_alive() and "answer" not in big  # the large one still runs
    assert answered_at <= 2 * 8 + 1
    thread.join(timeout=300)
    status, answer = big["answer"]
    assert status == 200 and len(answer["choices"]) == 400
    assert stats.rows - before.rows == 401 and stats.batches - before.batches == 400 // 8 + 1


def test_a_request_whose_client_went_away_never_reaches_the_engine(small_calls):
    """A request whose client disconnects while it waits is dropped before the engine runs it and is not counted
    as answered."""
    url, app = small_calls
    stats = app.state.batcher.stats
    before = dataclasses.replace(stats)
    thread, big = in_background(url, {"prompt": "3+4=", "n": 64, "max_tokens": 16, "temperature": 1.0})
    wait_for(lambda: stats.batches > before.batches, "the first request never started")
    body = json.dumps({"prompt": "7+7=", "n": 8, "max_tokens": 16, "temperature": 0.5}).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:  # sent whole, then gone
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_for(lambda: stats.disconnected > before.disconnected, "the disconnect was never seen")
    thread.join(timeout=300)
    assert big["answer"][0] == 200
    assert (stats.requests - before.requests, stats.disconnected - before.disconnected) == (1, 1)
    assert stats.rows - before.rows == 64  # none of the gone request's 8 rows


class KillAfter:
    """An app that dies, as a judge server killed mid-run does: after `completions` completion requests it shuts
    its server down (a later request meets a closed port, or a 503 while it closes)."""

    def __init__(self, app, completions: int):
        self.app, self.left, self.server = app, completions, None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            return await self.app(scope, receive, send)
        if self.left <= 0:
            from starlette.responses import PlainTextResponse

            return await PlainTextResponse("shutting down", 503)(scope, receive, send)
        self.left -= 1
        await self.app(scope, receive, send)
        if self.left == 0:
            self.server.should_exit = True


def test_a_run_stops_when_its_judge_server_dies_and_resumes_to_the_uninterrupted_metrics(tmp_path, toy_cache,
                                                                                       grm):
    """SCR, 6 steps, the judge greedy and served: the server dies after step 2 (its probe and the requests of steps
    1 and 2, as many as the uninterrupted run's: a question asked twice is one request);
    the run stops at step 3 naming the failure, keeps step 2's checkpoint, and once the server is back a rerun
    resumes from it to the metrics of an uninterrupted run."""
    from conftest import read_metrics
    from test_faults import assert_same_metrics
    from test_openai_engine import served_run

    from rrc_jax.errors import Diverged
    from rrc_jax.rl.trainer import run

    _, model, tokenizer = grm
    app = lambda: make_app(make_sampler("grm", model, tokenizer), tokenizer, served_name="toy-grm",  # noqa: E731
                           vocab_size=model.cfg.vocab_size)
    config = lambda workdir, url: served_run(workdir, toy_cache, url, "toy-grm", **{  # noqa: E731
        "steps": 6, "checkpoint.save_every": 1, "reward.judge.max_new_tokens": 48, "inference.retries": 1,
        "inference.timeout_s": 30.0})
    with serving(app()) as url:
        straight = read_metrics(run(validate(config(tmp_path / "straight", url))))

    requests = [int(straight[step]["judge/requests"]) for step in (1, 2, 3)]  # at most 4 x 6 pairs x 2 votes
    assert all(0 < r <= 48 for r in requests)
    dying = KillAfter(app(), 1 + requests[0] + requests[1])
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    dying.server = uvicorn_server(dying)
    thread = threading.Thread(target=dying.server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: dying.server.started, "the server never started")
    url, workdir = f"http://127.0.0.1:{port}", tmp_path / "killed"
    with pytest.raises(Diverged) as e:
        run(validate(config(workdir, url)))
    thread.join(timeout=60)
    assert str(e.value).startswith(f"step 3: the judge server {url} left {requests[2]} of {requests[2]} requests of "
                                   "the step's judging unanswered (")
    assert "connection refused: " in str(e.value) or "another HTTP error: " in str(e.value)
    assert sorted(read_metrics(workdir)) == [0, 1, 2, 3]  # step 3 logged, not saved
    assert (workdir / "checkpoints" / "2").is_dir() and not (workdir / "checkpoints" / "3").exists()
    with serving(app(), port=port):
        run(validate(config(workdir, url)))
    assert_same_metrics(straight, read_metrics(workdir))


class Canned:
    """A fake engine of a 64-token context answering every question with the text `7`, then its stop token (2)."""

    stop_token_ids, context_length = (2,), 64

    def __init__(self, tokenizer):
        self.seven = tokenizer.convert_tokens_to_ids("7")

    def complete(self, prefixes, suffixes, params, rng=0, **kw):
        rows, cap = len(suffixes), params.max_new_tokens
        tokens = np.zeros((rows, cap), np.int32)
        tokens[:, 0], tokens[:, 1] = self.seven, 2
        return SampleOutput(tokens, np.zeros((rows, cap), np.float32), np.full(rows, 2, np.int32),
                            np.zeros(rows, bool))


class Counting:
    """The char tokenizer (its longest token: `<pad>`, 5 characters), keeping the length of each text it
    tokenizes (`texts`)."""

    def __init__(self):
        from rrc_jax.models.char_tokenizer import make_char_tokenizer

        self.inner, self.texts = make_char_tokenizer(), []

    def __call__(self, text, **kw):
        self.texts.append(len(text))
        return self.inner(text, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def asgi_posts(app, bodies, content_length: bool = True, path: str = "/v1/completions"
               ) -> list[tuple[int, dict, int]]:
    """(status, JSON answer, body chunks the app read) of each POST to `path` of `bodies` (each bytes, or a list of
    chunks), made straight to the ASGI `app` in turn, with a Content-Length or streamed without one."""
    async def post(chunks):
        left, read, sent, done = list(chunks), 0, [], asyncio.Event()

        async def receive():
            nonlocal read
            if left:
                read += 1
                return {"type": "http.request", "body": left.pop(0), "more_body": bool(left)}
            await done.wait()  # (the app watches for a disconnect while its request runs)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        headers = [(b"content-type", b"application/json")]
        if content_length:
            headers.append((b"content-length", str(sum(map(len, chunks))).encode()))
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "root_path": "", "headers": headers, "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80)}
        try:
            await app(scope, receive, send)
        except Exception:  # noqa: BLE001 - a 500 was sent first: its status is what is checked
            pass
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        try:
            answer = json.loads(body)
        except ValueError:
            answer = {"error": {"message": body.decode(errors="replace")}}
        return sent[0]["status"], answer, read

    async def all_of():
        return [await post([b] if isinstance(b, bytes) else b) for b in bodies]

    try:
        return asyncio.run(all_of())
    finally:
        if hasattr(app.state, "batcher"):
            app.state.batcher.close()


def test_a_body_over_the_limit_is_refused_without_being_read_whole():
    """A body over `max_body_bytes` is a 413 naming the limit and the flag: one whose Content-Length says so before
    any of it is read, one streamed without it once the limit is passed; a body within it is answered."""
    tokenizer = Counting()
    app = lambda: make_app(Canned(tokenizer), tokenizer, max_body_bytes=1000)  # noqa: E731
    big = [b" " * 100] * 30
    small = json.dumps({"prompt": "3+4=", "max_tokens": 4}).encode()
    (told, told_answer, told_read), (fine, answer, _) = asgi_posts(app(), [big, small])
    (streamed, streamed_answer, streamed_read), = asgi_posts(app(), [big], content_length=False)
    assert (told, told_read) == (413, 0)
    assert told_answer["error"]["message"] == (
        "the body (3000 bytes or more) exceeds the server's limit of 1000 bytes (rrc_jax.serve --max_body_mb); send "
        "fewer or shorter prompts a request")
    assert streamed == 413 and streamed_read == 11  # 1100 bytes: no chunk after the one past the limit
    assert "limit of 1000 bytes (rrc_jax.serve --max_body_mb)" in streamed_answer["error"]["message"]
    assert fine == 200 and [c["text"] for c in answer["choices"]] == ["7"]


def test_a_text_prompt_the_context_cannot_hold_is_refused_before_it_is_tokenized():
    """A context of 64 tokens of at most 5 characters holds at most 320 characters: a longer text prompt is a 400
    naming it and the limit, and nothing of the request is tokenized."""
    tokenizer = Counting()
    (status, answer, _), = asgi_posts(make_app(Canned(tokenizer), tokenizer),
                                      [json.dumps({"prompt": ["1+1=", "9" * 321]}).encode()])
    assert status == 400 and answer["error"]["message"] == (
        "'prompt'[1] holds 321 characters, more than the model's context of 64 tokens can hold (320 characters: 5 a "
        "token at most); shorten it")
    assert tokenizer.texts == []


def test_malformed_json_is_a_400_naming_what_is_wrong_never_a_500():
    """JSON nested too deeply, a lone surrogate (a JSON escape) in a prompt, a stop string, a field's name or a
    value quoted back, a number past a float's range: each a 400 (the wrong model a 404) naming it, in a message
    that can be sent and stays short."""
    tokenizer = Counting()
    cases = (
        (b"[" * 100_000, "the body's JSON is nested too deeply"),
        (b"[" * 100_000 + b"]" * 100_000, "the body's JSON is nested too deeply"),
        (rb'{"prompt": "\ud800"}', "'prompt' is not valid Unicode: it holds a lone surrogate, '\\ud800' at "
                                    "character 0; send UTF-8 text"),
        (rb'{"prompt": ["1", "ab\udfff"]}', "'prompt'[1] is not valid Unicode: it holds a lone surrogate, "
                                             "'\\udfff' at character 2"),
        (rb'{"prompt": "1", "stop": ["\ud800"]}', "'stop' is not valid Unicode"),
        (rb'{"prompt": "1", "\ud800": 1}', "'\\ud800' is not a parameter this server knows"),
        (rb'{"prompt": "1", "stop_token_ids": "\ud800"}', "'stop_token_ids' must be a list of token ids (integers), "
                                                           "got '\\ud800'"),
        (rb'{"prompt": "1", "model": "\ud800"}', "the model '\\ud800' is not served here"),
        (b'{"prompt": "1", "n": 1' + b"0" * 400 + b"}", "exceeds the 16777216 tokens one request may ask for"),
        (b'{"prompt": "1", "temperature": 1' + b"0" * 400 + b"}", "'temperature' is out of range, got 1000"),
        (json.dumps({"prompt": "1", "echo": "x" * 10_000}).encode(), "'echo' is not applied by this server (got "
                                                                      "'xxx"))
    answers = asgi_posts(make_app(Canned(tokenizer), tokenizer), [body for body, _ in cases])
    for (body, message), (status, answer, _) in zip(cases, answers):
        text = answer["error"]["message"]
        assert status == (404 if b"model" in body else 400) and message in text and len(text) < 300, (body[:60],
                                                                                                     answer)
    assert tokenizer.texts == []
