"""A judge server that takes text prompts only: `transformers serve` (transformers' own OpenAI-compatible server,
the `serving` extra of transformers; continuous batching on the CPU) on the loopback with the toy world's judge.
The probe chooses text from the server's refusal of token ids and names the refusal; the judge's greedy judgments
through it are the in-process judge's, every prompt tokenizing back to its ids; a two-step AGR run with the judge
served there gives the in-process run's series. Against `rrc_jax.serve` token ids are still sent."""

import contextlib
import socket
import subprocess
import time
import urllib.request

import pytest
from conftest import console_tool, read_metrics, tiny_config
from test_serve import JUDGING, PROMPTS, RESPONSES

from rrc_jax.config import validate
from rrc_jax.errors import ConfigError
from rrc_jax.inference import make_sampler
from rrc_jax.judge import Judge
from rrc_jax.models import load_hf, load_tokenizer
from rrc_jax.rl.roles import Roles
from rrc_jax.rl.trainer import run

pytestmark = pytest.mark.skipif(console_tool("transformers") is None,
                                reason="transformers' console tool is missing (pip install 'transformers[serving]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def toy_grm(toy_cache):
    path = Roles.of_run(validate(tiny_config("agr", "unused", toy_cache))).path("grm")
    return path, load_hf(path), load_tokenizer(path)


@contextlib.contextmanager
def serve_with_transformers(model_dir, log_path):
    """The base URL of `transformers serve` (continuous batching, on the CPU) serving `model_dir` on the loopback
    until the block ends; its output in `log_path`. Its paged cache is sized here (16,384 tokens in blocks of 32):
    left to itself it takes a share of the machine's free memory (14 GB of 24 here), and the out-of-memory killer
    ends its model's process while the suite's other workers run."""
    url = f"http://127.0.0.1:{free_port()}"
    with open(log_path, "w") as log:
        server = subprocess.Popen([console_tool("transformers"), "serve", str(model_dir), "--host", "127.0.0.1",
                                   "--port", url.rsplit(":", 1)[1], "--device", "cpu", "--continuous-batching",
                                   "--cb-block-size", "32", "--cb-num-blocks", "512", "--cb-max-batch-tokens", "2048"],
                                  stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while True:
                assert server.poll() is None, f"transformers serve exited: see {log_path}"
                try:
                    urllib.request.urlopen(url + "/v1/models", timeout=5).read()
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"transformers serve did not start in 180 s: see {log_path}"
                    time.sleep(0.5)
            yield url
        finally:
            server.terminate()
            server.wait(timeout=30)


@pytest.fixture(scope="module")
def transformers_serve(toy_grm, tmp_path_factory):
    """`transformers serve` serving the toy judge for the module."""
    with serve_with_transformers(toy_grm[0], tmp_path_factory.mktemp("serve") / "transformers_serve.log") as url:
        yield url


def test_the_probe_sends_text_where_ids_are_refused_and_names_what_was_refused(toy_grm, transformers_serve, capsys):
    _, model, tokenizer = toy_grm
    text = make_sampler("grm", model.cfg, tokenizer, engine={"engine": "openai", "url": transformers_serve})
    text.probe()
    assert text.prompt_format == "text" and text.api_model == str(toy_grm[0])  # the server's one model
    said = capsys.readouterr().err
    assert f"the judge server {transformers_serve} refused token ids (HTTP 422" in said and "top_k" in said
    ids = make_sampler("grm", model.cfg, tokenizer,
                       engine={"engine": "openai", "url": transformers_serve, "prompt_format": "ids"})
    with pytest.raises(ConfigError, match="server is up but refused the request.*prompt_format=text") as refused:
        ids.probe()
    assert "HTTP 422" in str(refused.value) and "start the server" not in str(refused.value)
    neither = make_sampler("grm", model.cfg, tokenizer, engine={"engine": "openai", "url": transformers_serve,
                                                                "extra_body": '{"best_guess": 1}'})
    with pytest.raises(ConfigError, match="in ids then text: HTTP 422.*; in text: HTTP 422.*best_guess"):
        neither.probe()


def test_greedy_judgments_sent_as_text_are_the_in_process_judges(toy_grm, transformers_serve):
    """Every judgment (text and verdict) of an SCR round robin over 6 groups of 4, each question's text the server
    tokenizes back to the question's ids."""
    _, model, tokenizer = toy_grm
    local = Judge(make_sampler("grm", model, tokenizer), tokenizer, JUDGING)
    sampler = make_sampler("grm", model.cfg, tokenizer, engine={"engine": "openai", "url": transformers_serve})
    sampler.probe()
    remote = Judge(sampler, tokenizer, JUDGING)
    local.trace, remote.trace = [], []
    assert (remote.round_robin(PROMPTS, RESPONSES) == local.round_robin(PROMPTS, RESPONSES)).all()
    assert remote.trace == local.trace and {t["verdict"] for t in local.trace} >= {"A", "B"}
    summary = remote.summary()
    assert summary["failed_requests"] == 0 and summary["retokenized_prompts"] == 0
    order = lambda t: (t["j"], t["i"]) if t["swapped"] else (t["i"], t["j"])  # noqa: E731
    shown = {(t["prompt"], *(RESPONSES[t["prompt"]][x] for x in order(t))) for t in local.trace}
    assert summary["requests"] == len(shown) < 36  # a question asked twice (a response twice in a group): once


def test_a_two_step_run_judged_by_transformers_serve_gives_the_in_process_series(tmp_path, toy_cache,
                                                                                 transformers_serve):
    common = {"eval.judge_votes": 0, "reward.judge.max_new_tokens": 48}
    runs = {}
    for way, overrides in (("jax", {}), ("text", {"inference.engine": "openai", "inference.url": transformers_serve})):
        runs[way] = read_metrics(run(validate(tiny_config("agr", tmp_path / way, toy_cache, **common, **overrides))))
    here, there = runs["jax"], runs["text"]
    assert sorted(here) == sorted(there) == [0, 1, 2]
    series = lambda rows, key: [rows[s].get(key) for s in sorted(rows)]  # noqa: E731
    for key in ("reward/mean", "reward/std", "judge/abstain_rate", "judge/questions", "oracle_quality", "loss"):
        assert series(here, key) == series(there, key), key
    assert any(here[s]["reward/std"] > 0 for s in (1, 2))  # verdicts that rank
    assert [there[s]["judge/retokenized_prompts"] for s in (1, 2)] == [0, 0]
    assert all(there[s]["judge/failed_requests"] == 0 for s in (1, 2))
    assert "judge/retokenized_prompts" not in here[1]
