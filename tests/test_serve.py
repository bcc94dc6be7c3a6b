"""The judge served over HTTP (`rrc_jax.inference.server`, `python -m rrc_jax.serve`) and asked through the HTTP
engine on the loopback address: at temperature 0 its verdicts are the in-process judge's, and the main job with
`inference.engine=openai` pointed at it gives the in-process run's series without loading the judge's weights."""

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from rrc_jax.inference import make_sampler
from rrc_jax.inference.server import make_app, serving
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

    path = Roles.from_config(tiny_config("scr", "unused", toy_cache)).path("grm")
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
                                                                      "concurrency": 16}), tokenizer, JUDGING)
    local.trace, remote.trace = [], []
    before = dict(vars(app.state.batcher.stats))
    counts = local.round_robin(PROMPTS, RESPONSES)
    assert (remote.round_robin(PROMPTS, RESPONSES) == counts).all()
    assert remote.trace == local.trace and len(local.trace) == 36
    assert {t["verdict"] for t in local.trace} >= {"A", "B"}  # verdicts both ways
    stats = vars(app.state.batcher.stats)
    requests, batches = stats["requests"] - before["requests"], stats["batches"] - before["batches"]
    assert requests == 36 and batches < requests  # concurrent requests shared engine calls
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
            ({"prompt": "1", "logprobs": 2}, 400, "'logprobs' are not served"),
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


def test_the_main_job_with_the_served_judge_gives_the_in_process_series(tmp_path, toy_cache, grm, served,
                                                                       monkeypatch):
    """SCR, 2 steps, the judge greedy: `inference.engine=openai` pointed at the served toy judge gives the
    in-process run's eval/oracle_quality series and rewards, and the trainer never loads the judge's weights."""
    from conftest import read_metrics, tiny_config

    import rrc_jax.rl.roles
    from rrc_jax.rl.trainer import run

    url, _ = served
    loaded = []
    real = rrc_jax.rl.roles.load_hf
    monkeypatch.setattr(rrc_jax.rl.roles, "load_hf", lambda path, **kw: loaded.append(path) or real(path, **kw))
    common = {"eval.judge_votes": 0, "reward.judge.max_new_tokens": 48}
    runs = {}
    for engine in ("jax", "openai"):
        loaded.clear()
        workdir = run(tiny_config("scr", tmp_path / engine, toy_cache, **common, **{
            "inference.engine": engine, **({"inference.url": url} if engine == "openai" else {})}))
        runs[engine] = (read_metrics(workdir), list(loaded))
    (here, here_loaded), (there, there_loaded) = runs["jax"], runs["openai"]
    assert grm[0] in here_loaded and grm[0] not in there_loaded
    assert sorted(here) == sorted(there) == [0, 1, 2]
    series = lambda rows, key: [rows[s].get(key) for s in sorted(rows)]  # noqa: E731
    assert series(here, "eval/oracle_quality") == series(there, "eval/oracle_quality")
    assert [q for q in series(here, "eval/oracle_quality") if q is not None]
    for key in ("reward/mean", "reward/std", "judge/abstain_rate", "judge/questions", "oracle_quality"):
        assert series(here, key) == series(there, key), key
    assert any(here[s]["reward/std"] > 0 for s in (1, 2))  # verdicts that rank
    assert all(there[s]["judge/failed_requests"] == 0 for s in (1, 2))


def test_the_serve_command_serves_a_checkpoint(grm, tmp_path):
    """`python -m rrc_jax.serve --model=DIR --port=P` answers a completion; a bad flag is one line."""
    import socket

    path, _, _ = grm
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "rrc_jax.serve", f"--model={path}", f"--port={port}",
                             "--served_name=judge"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.time() + 300
        while True:
            try:
                status, answer = post(url, {"prompt": "3+4=", "max_tokens": 4, "temperature": 0, "model": "judge"})
                break
            except urllib.error.URLError:
                assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
                time.sleep(0.5)
        assert status == 200 and answer["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    bad = subprocess.run([sys.executable, "-m", "rrc_jax.serve", f"--model={path}", "--max_batch=0"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == "error: --max_batch=0: must be >= 1"
