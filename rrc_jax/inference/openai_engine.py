"""An inference engine over HTTP: the Sampler protocol (`rrc_jax.inference.sampler`) answered by an
OpenAI-compatible `/v1/completions` endpoint (vLLM, SGLang, TGI, JetStream), so that a judge need not live in the
trainer's process.

Each different question of `complete` (a pair's votes in one order are one question asked `n` times), and each
prompt of `generate` (`n` = the group size), is a prompt of a request: its token ids, which vLLM and SGLang take as
they are (nothing is tokenized again on the server). A request carries up to `prompts_per_request` consecutive
prompts with the same `n` (the completions API's list `prompt`), so that a server batches a call's questions as
the in-process engine does instead of a few at a time; `concurrency` threads send them.

Servers that take text only (`transformers serve`, Ollama, many hosted endpoints) are sent text (`prompt_format`
"text"; "auto", the default, lets the probe choose from the server's answer): a prompt's ids decoded with their
special tokens, one prompt and one sample a request (such servers ignore `n` and refuse a list of prompts), sample
j of a prompt with its stream's seed + j, and only the legacy completions API's own fields (`model`, `prompt`,
`max_tokens`, `temperature`, `top_p`, `seed`; a row ends where the model's own end tokens end it, as the server's
generation config says: a stop string in `stop` is matched on text, which tokenizers of special tokens only break)
plus `extra_body` (a server's own fields: for
`transformers serve`, which samples only where `do_sample` is set, `{"generation_config": "{\"do_sample\":
true}"}`). The server tokenizes the text again: a prompt whose text does not tokenize back to its ids with the
judge's tokenizer is counted (`stats.retokenized`, `judge/retokenized_prompts`), never silently sent as another. Reusing the prefix many
questions share (the judge's `[instruction, prompt]`) is the server's business: vLLM's automatic prefix caching
does it, `rrc_jax.serve` prefills a batch's shared prefixes once, and so this engine has no `prefix_reuse`.

`url` may list several servers of one model (comma-separated): a judge pool (`rrc_jax.inference.pool`). Each
attempt goes to the least loaded, a failed request's next attempt to another, and a server that keeps failing is
benched (`bench_after` failures in a row, for `bench_s` seconds) and probed again; a step's requests and failures
per server are counted (`judge/endpoint<i>_attempts`, `_failed`, `_benched`).

Before a run asks anything, `probe()` checks every server once (`rrc_jax.inference.factory.role_sampler` calls it):
`GET /v1/models` must list `api_model` and a one-token completion must come back as a completion; a server that is
down, serves another model or is not a completions server (an HTML page with status 200) is a one-line
`ConfigError` naming the URL, the model and what came back. With `prompt_format` "auto" a server that refuses the
token-id completion (an HTTP error: `400 prompt must be a string`) is asked again in text; the sampler sends text
when every server took it, and says so in one log line naming the refusal; a server that refuses both is a
`ConfigError` naming both refusals.

During a run a failed request is an abstention, never a crash and never a silent zero. A request that fails is
retried `retries` times (on another server when there is one; on the same one after `backoff_s`, doubling); one
whose every attempt failed, or that outlived `timeout_s` (each attempt's limit), gives an empty continuation (length
0), in which the judge's parser finds no verdict and counts an abstention. `stats` counts the requests sent, those
left unanswered (`failed`) and each by the kind of its last failure (`FAILURES`: refused, timed out, dropped, 404,
another HTTP error, garbled: not JSON, not a completion, or not as many choices as asked), which the judge logs as
`judge/requests`, `judge/failed_requests`, `judge/timeouts`, ...; `stats.retries` counts the attempts made again,
and `last_failed` the questions of the last `complete` call left unanswered. A run stops when more than
`inference.max_failed_fraction` of a step's requests failed (`rrc_jax.rl.guard`), naming the kinds (`failure_text`).

The texts that come back are tokenized with the sampler's tokenizer (`SampleOutput.tokens`, cut at
`max_new_tokens`; a row the server finished, `finish_reason` "stop", ends with the first stop token as the JAX
engine's rows do; any other is `truncated`); their log-probs are 0: the judge reads texts only.
`next_token_logprobs` (PRC's P(A)) needs the log-probs of two given tokens, which the completions API does not give
(only its top k): a `NotImplementedError` naming the jax engine. `generate` serves a policy's rollouts only for
evaluation-style use: the learner needs the rollout log-probs, which this engine does not have.

Shapes as in `rrc_jax.inference.sampler`: Q questions, B prompts, G continuations a prompt, N = `max_new_tokens`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from rrc_jax.errors import ConfigError
from rrc_jax.inference.pool import Attempt, EndpointPool
from rrc_jax.inference.sampler import SampleOutput, SamplerStats, SamplingParams, Suffix
from rrc_jax.models import stop_tokens
from rrc_jax.progress import say

# Options the callers pass to every engine that only the JAX engine uses: the server batches, places and reuses
# prefixes itself.
JAX_ENGINE_OPTIONS = ("max_batch", "max_batch_tokens", "prefix_reuse", "layout", "continuous")


PROMPT_FORMATS = ("auto", "ids", "text")  # `prompt_format`: chosen by the probe, token ids, or text


# How a request failed, by its last attempt: the `HttpStats` counter (and `judge/<counter>` metric) of each kind, and
# how a stop names it.
FAILURES = {"refused": ("refused", "connection refused"), "timeout": ("timeouts", "timed out"),
            "dropped": ("dropped", "connection dropped"), "not_found": ("not_found", "HTTP 404"),
            "http_error": ("http_errors", "another HTTP error"), "garbled": ("garbled", "not a completion")}


@dataclasses.dataclass
class HttpStats(SamplerStats):
    """`SamplerStats` (`calls`: the requests sent, each of up to `prompts_per_request` different questions, or
    prompts of `generate`) plus those left without an answer (`failed`), each counted by the kind of its last failure
    (`FAILURES`), the rows they held (`unanswered`: prompts x n), and the attempts made again (`retries`). With
    several servers (a pool), each one's attempts, failed attempts and benchings (`endpoints`: [attempts, failed,
    benched] by server index)."""

    failed: int = 0
    unanswered: int = 0
    refused: int = 0
    timeouts: int = 0
    dropped: int = 0
    not_found: int = 0
    http_errors: int = 0
    garbled: int = 0
    retries: int = 0
    retokenized: int | None = None  # text prompts that do not tokenize back to their ids (None: ids are sent)
    endpoints: list[list[int]] = dataclasses.field(default_factory=list)

    def reset(self) -> None:
        servers, text = len(self.endpoints), self.retokenized is not None
        super().reset()
        self.endpoints = [[0, 0, 0] for _ in range(servers)]
        self.retokenized = 0 if text else None

    def failures(self) -> dict[str, int]:
        per_server = {f"endpoint{i}_{name}": n for i, counts in enumerate(self.endpoints)
                      for name, n in zip(("attempts", "failed", "benched"), counts)} if len(self.endpoints) > 1 else {}
        text = {} if self.retokenized is None else {"retokenized_prompts": self.retokenized}
        return {"requests": self.calls, "failed_requests": self.failed, "unanswered_questions": self.unanswered,
                **{counter: getattr(self, counter) for counter, _ in FAILURES.values()}, **per_server, **text}


def failure_text(counts: Mapping[str, float]) -> str:
    """The failed requests of `counts` (`HttpStats.failures()`' names) by kind, e.g. `connection refused: 48`."""
    return ", ".join(f"{name}: {int(counts[counter])}" for counter, name in FAILURES.values()
                     if counts.get(counter, 0) > 0) or "none"


class RequestFailed(Exception):
    """One request's last attempt failed, of `kind` (`FAILURES`)."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def check_urls(urls: str | Sequence[str], where: str = "config.inference.url") -> list[str]:
    """The servers of `urls` (a comma-separated string or a list), each checked by `check_url`."""
    listed = [u.strip() for u in urls.split(",")] if isinstance(urls, str) else list(urls)
    return [check_url(u, where) for u in listed]


def check_url(url: str, where: str = "config.inference.url") -> str:
    """`url` (an http(s) base URL with a host) without a trailing `/` or `/v1` (the OpenAI clients' base URL form);
    else a one-line `ConfigError` naming `where`."""
    try:
        parts = urllib.parse.urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 1) > 0
    except ValueError:  # a port that is not a number
        ok = False
    if not ok:
        raise ConfigError(f"{where}: {url!r} is not an http(s) URL with a host; give the server's base URL, e.g. "
                          "http://10.0.0.2:8000")
    url = url.rstrip("/")
    return url[:-len("/v1")] if url.endswith("/v1") else url


def _snippet(data: bytes | str, n: int = 120) -> str:
    text = data.decode(errors="replace") if isinstance(data, bytes) else data
    return repr(" ".join(text.split())[:n])


def _seed(rng: jax.Array | int) -> int:
    """An int seed from a PRNG key or an int: request i is sent with seed `_seed(rng) + i`."""
    if isinstance(rng, (int, np.integer)):
        return int(rng) % (1 << 31)
    return int(jax.random.randint(rng, (), 0, (1 << 31) - 1))


class OpenAISampler:
    """The Sampler protocol over an OpenAI-compatible completions endpoint (the module docstring).

    Args:
      model: the judge's `Decoder` or its `DecoderConfig` (`Roles.config`), for its stop tokens and context length
        only (the weights live on the server); None when neither is at hand.
      tokenizer: the judge model's tokenizer (ids in, texts back to ids).
      role: the role it samples for (`rrc_jax.sharding.ROLES`).
      url: the server's base URL, e.g. `http://10.0.0.2:8000` (`/v1/completions` is appended), or several servers of
        one model (a comma-separated string or a list: a pool, `rrc_jax.inference.pool`).
      api_model: the model name the server serves (the request's `model`).
      concurrency: requests in flight at once.
      prompts_per_request: the most prompts one request carries (the completions API's list `prompt`; 1: a request
        a prompt).
      timeout_s: each attempt's limit, connection and answer included.
      retries: attempts after the first (on another server where there is one, else after `backoff_s`, doubling).
      bench_after, bench_s: a server whose `bench_after` attempts in a row failed is left out for `bench_s` s.
      context_length: the most tokens a row may hold on the server (default: the model's positions; None when
        unknown: nothing is checked here).
      prompt_format: `PROMPT_FORMATS`: "ids" (token ids, a list of prompts and `n` a request), "text" (a string
        and one sample a request; the module docstring), or "auto": what the probe finds (ids until it runs).
      extra_body: fields added to every request's body (a server's own settings).

    After each `complete` call, `last_failed` `[Q]` (bool, in the order of its suffixes) marks the questions left
    unanswered: their request failed after every retry (an empty row, an abstention). A caller that caches
    judgments caches the others only.
    """

    def __init__(self, model=None, tokenizer=None, *, role: str = "grm", url: str | Sequence[str] = "",
                 api_model: str = "", concurrency: int = 16, prompts_per_request: int = 32, timeout_s: float = 60.0,
                 retries: int = 2, backoff_s: float = 0.5, bench_after: int = 3, bench_s: float = 30.0,
                 stop_token_ids: Sequence[int] | None = None, pad_id: int | None = None,
                 context_length: int | None = None, prompt_format: str = "auto",
                 extra_body: Mapping | None = None, **jax_engine_options):
        unknown = sorted(set(jax_engine_options) - set(JAX_ENGINE_OPTIONS))
        if unknown:
            raise TypeError(f"OpenAISampler: unknown options {', '.join(unknown)}")
        if not url:
            raise ValueError("OpenAISampler: url is empty; give the server's base URL, e.g. http://127.0.0.1:8000")
        self.pool = EndpointPool(check_urls(url, "OpenAISampler: url"), bench_after=bench_after, bench_s=bench_s)
        self.url = ", ".join(e.url for e in self.pool.endpoints)  # (in messages)
        if tokenizer is None:
            raise ValueError("OpenAISampler: a tokenizer is needed (token ids are sent, texts come back)")
        if concurrency < 1 or prompts_per_request < 1 or timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError(f"OpenAISampler: need concurrency >= 1, prompts_per_request >= 1, timeout_s > 0, "
                             f"retries >= 0, backoff_s >= 0; got {concurrency}, {prompts_per_request}, {timeout_s}, "
                             f"{retries}, {backoff_s}")
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"OpenAISampler: prompt_format {prompt_format!r} is not one of "
                             f"{', '.join(PROMPT_FORMATS)}")
        self.tokenizer, self.role = tokenizer, role
        self.prompt_format, self.extra_body = prompt_format, dict(extra_body or {})
        self.api_model = api_model
        self.concurrency, self.prompts_per_request = concurrency, prompts_per_request
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        cfg = getattr(model, "cfg", model)  # a Decoder's config, or the config itself
        if stop_token_ids is None:
            stop_token_ids = stop_tokens(cfg.eos_token_ids if cfg is not None else (), tokenizer)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.pad_id = int(pad_id if pad_id is not None else (getattr(tokenizer, "pad_token_id", None) or 0))
        if context_length is None and cfg is not None:
            context_length = int(cfg.max_position_embeddings)
        self.context_length = context_length
        self.stats = HttpStats(endpoints=[[0, 0, 0] for _ in self.pool.endpoints],
                               retokenized=0 if prompt_format == "text" else None)
        self.last_failed = np.zeros(0, bool)

    def update_weights(self, params) -> int:
        """The server holds its own weights: nothing is synced here (a judge's weights do not change)."""
        return 0

    # -- one request --------------------------------------------------------------------------------------------

    def _request(self, url: str, path: str, body: dict | None = None):
        """One attempt at `GET path` (or `POST path` with the JSON `body`) of the server at `url`: the parsed JSON
        answer, or `RequestFailed` of its kind."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"},
                                         method="GET" if body is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except TimeoutError as e:
            raise RequestFailed(f"timed out after {self.timeout_s} s", "timeout") from e
        except urllib.error.HTTPError as e:  # (a URLError: first)
            kind = "not_found" if e.code == 404 else "http_error"
            raise RequestFailed(f"HTTP {e.code} ({e.reason}): {_snippet(e.read())}", kind) from e
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise RequestFailed(f"timed out after {self.timeout_s} s", "timeout") from e
            if isinstance(e.reason, ConnectionRefusedError):
                raise RequestFailed("connection refused", "refused") from e
            raise RequestFailed(f"unreachable ({e.reason})", "refused") from e
        except (OSError, http.client.HTTPException) as e:  # a connection closed or reset before the answer
            raise RequestFailed(f"connection dropped ({type(e).__name__}: {e})", "dropped") from e
        try:
            return json.loads(raw)
        except ValueError:
            raise RequestFailed(f"a body that is not JSON: {_snippet(raw)}", "garbled") from None

    def _post(self, url: str, body: dict, expected: int) -> dict:
        """One attempt at a completion of `expected` choices (prompts x n) from the server at `url`: the parsed
        answer, or `RequestFailed` (an answer of another number of choices is garbled: the attempt failed)."""
        answer = self._request(url, "/v1/completions", body)
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices or not all(
                isinstance(c, dict) and isinstance(c.get("text"), str) for c in choices):
            raise RequestFailed(f"not a completion: {_snippet(json.dumps(answer))}", "garbled")
        if len(choices) != expected:
            raise RequestFailed(f"{len(choices)} choices for the {expected} asked (prompts x n)", "garbled")
        return answer

    def _attempts(self, attempt, pinned: str = ""):
        """`attempt(url)` with the retries, each on the pool's choice of server (another than those it failed on,
        where one is in play; the same one after the backoff), or on the server at `pinned` alone (uncounted: the
        probe): its result, or the last attempt's `RequestFailed`; and the attempts made again."""
        wait, failed_on = self.backoff_s, set()
        for n in range(self.retries + 1):
            server = None if pinned else self.pool.acquire(avoid=failed_on)
            url = pinned or server.url
            if url in failed_on:  # nowhere else to ask
                time.sleep(wait)
                wait *= 2
            try:
                result = attempt(url)
            except RequestFailed as failure:
                last = failure
                failed_on.add(url)
                if server is not None:
                    self._count(server, ok=False)
            else:
                if server is not None:
                    self._count(server, ok=True)
                return result, n
        return last, self.retries

    def _count(self, server: Attempt, ok: bool) -> None:
        benched = self.pool.release(server, ok)
        counts = self.stats.endpoints[server.index]
        counts[0] += 1
        counts[1] += not ok
        counts[2] += benched

    def _ask(self, body: dict, expected: int) -> tuple[list[dict] | RequestFailed, int]:
        """A request of `expected` choices with its retries: the answer's choices (sorted by index), or the last
        attempt's failure; and the attempts made again."""
        answer, retries = self._attempts(lambda url: self._post(url, body, expected))
        if isinstance(answer, RequestFailed):
            return answer, retries
        return sorted(answer["choices"], key=lambda c: c.get("index", 0)), retries

    def probe(self) -> None:
        """Ask each server once (the module docstring): a `ConfigError` naming the URL, the model and what came
        back unless it lists `api_model` and answers a one-token completion in the prompt format the sampler sends
        (with "auto": token ids, else text where some server refused ids and every one takes text). A server's
        `max_model_len` lowers `context_length` to it (a question that does not fit is then not sent:
        `rrc_jax.judge`)."""
        formats = ["ids", "text"] if self.prompt_format == "auto" else [self.prompt_format]
        refused = {url: self._probe(url, formats) for url in (server.url for server in self.pool.endpoints)}
        text = next((f"{url} refused token ids ({failure})" for url, failure in refused.items() if failure), "")
        if text:
            say(f"the judge server {text}; sending text prompts (config.inference.prompt_format=text)")
        self._use_format("text" if text or formats == ["text"] else "ids")

    def _use_format(self, prompt_format: str) -> None:
        self.prompt_format = prompt_format
        self.stats.retokenized = 0 if prompt_format == "text" else None

    def _probe(self, url: str, formats: list[str]) -> RequestFailed | None:
        """Check the server at `url` in the first of `formats` it takes: None when it took the first, else the first's
        refusal (an HTTP error: the server answered)."""
        where = f"the judge server {url} (model {self.api_model or '(the server default)'!r})"

        def fix(failure: RequestFailed) -> str:
            if failure.kind in ("garbled", "not_found"):  # something answers there, not a completions server
                return "is config.inference.url the base URL of an OpenAI-compatible server?"
            if failure.kind == "http_error":  # it answered, and refused what was asked
                other = {"ids": "text", "text": "ids"}.get(self.prompt_format)
                return ("the server is up but refused the request; check config.inference.api_model and extra_body"
                        + (f", or set config.inference.prompt_format={other}" if other else ""))
            return "start the server (python -m rrc_jax.serve --model=DIR, or vLLM) or fix config.inference.url"

        listed, _ = self._attempts(lambda url: self._request(url, "/v1/models"), pinned=url)
        if isinstance(listed, RequestFailed):
            raise ConfigError(f"{where}: GET /v1/models: {listed}; {fix(listed)}")
        models = listed.get("data") if isinstance(listed, dict) else None
        if not isinstance(models, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str)
                                                   for m in models):
            raise ConfigError(f"{where}: GET /v1/models answered {_snippet(json.dumps(listed))}, not a list of "
                              "models; is config.inference.url the base URL of an OpenAI-compatible server?")
        served = {m["id"]: m for m in models}
        if not self.api_model and len(served) == 1:  # the server's one model (some servers refuse a request
            self.api_model = next(iter(served))  # naming none)
        if self.api_model and self.api_model not in served:
            raise ConfigError(f"{where}: the server serves {', '.join(map(repr, served)) or 'no model'}, not "
                              f"{self.api_model!r}; set config.inference.api_model to one of them")
        limit = served.get(self.api_model, next(iter(served.values()), {})).get("max_model_len")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            self.context_length = min(self.context_length or limit, limit)
        failures = []
        for prompt_format in formats:
            body = self._body(prompt_format, [[self.pad_id]], SamplingParams(max_new_tokens=1), seed=0)
            answer, _ = self._attempts(lambda url: self._post(url, body, 1), pinned=url)
            if not isinstance(answer, RequestFailed):
                return failures[0] if failures else None
            failures.append(answer)
            if answer.kind != "http_error":  # not a refusal of the format: asking in text will not help
                break
        said = "; in text: ".join(str(f) for f in failures)
        raise ConfigError(f"{where}: a one-token completion (POST /v1/completions) in "
                          f"{' then '.join(formats[:len(failures)])}: {said}; {fix(failures[-1])}")

    def _body(self, prompt_format: str, prompts: list[list[int]], params: SamplingParams, seed: int, n: int = 1,
              stops: Sequence[int] = ()) -> dict:
        """A request's body: `n` samples of each of `prompts` (token ids) as token ids with the server's sampling
        fields (vLLM's and SGLang's), or of the one prompt as text with the legacy completions API's own fields
        (the module docstring); and `extra_body`."""
        if prompt_format == "ids":
            return {"model": self.api_model, "prompt": prompts, "n": n, "max_tokens": params.max_new_tokens,
                    "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k or -1,
                    "seed": seed, "stop_token_ids": list(stops), "skip_special_tokens": True, **self.extra_body}
        if params.top_k:
            raise ValueError(f"top_k={params.top_k}: a server sent text prompts takes the legacy completions "
                             "API's fields only, which have no top_k; set the judge's top_k to 0")
        (prompt,) = prompts
        return {"model": self.api_model, "prompt": self._text(prompt), "n": 1, "max_tokens": params.max_new_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "seed": seed, **self.extra_body}

    def _text(self, ids: list[int]) -> str:
        """Prompt `ids` as the text the server tokenizes back (special tokens written out; a leading BOS left to the
        server's tokenizer where it adds one); a text that does not tokenize back to `ids` here is counted."""
        bos = getattr(self.tokenizer, "bos_token_id", None)
        adds_bos = bos is not None and self.tokenizer("").input_ids[:1] == [bos]
        body = ids[1:] if adds_bos and ids[:1] == [bos] else ids
        text = self.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if self.tokenizer(text).input_ids != ids and self.stats.retokenized is not None:
            self.stats.retokenized += 1
        return text

    def _requests(self, ns: list[int]) -> list[list[int]]:
        """The prompts of each request: prompts asking the same `n` (a request has one), in order, at most
        `prompts_per_request` of them."""
        by_n: dict[int, list[int]] = {}
        for i, k in enumerate(ns):
            by_n.setdefault(k, []).append(i)
        step = self.prompts_per_request
        return [same[at:at + step] for same in by_n.values() for at in range(0, len(same), step)]

    def _run(self, prompts: list[list[int]], n: int | Sequence[int], params: SamplingParams, rng,
             streams: Sequence[int] | None = None) -> tuple[SampleOutput, np.ndarray]:
        """`n` continuations of each prompt (an int, or one count a prompt): requests of up to `prompts_per_request`
        prompts with one `n` (`_requests`), each sent with the seed of its first prompt's stream (`streams[i]`,
        default i); prompt i's rows follow prompt i - 1's. A request's choice `index` is its prompt k x n + sample
        j. And whether each prompt's request failed `[len(prompts)]`."""
        base = _seed(rng)
        streams = range(len(prompts)) if streams is None else streams
        ns = [n] * len(prompts) if isinstance(n, int) else [int(k) for k in n]
        start = np.concatenate([[0], np.cumsum(ns)]).astype(int)
        stops = params.stop_token_ids if params.stop_token_ids is not None else self.stop_token_ids
        if self.prompt_format == "text":  # a prompt and a sample a request: sample j seeded with its stream + j
            requests = [[i] for i, k in enumerate(ns) for _ in range(k)]
            seeds = [base + int(streams[i]) + j for i, k in enumerate(ns) for j in range(k)]
            bodies = [self._body("text", [prompts[i]], params, seed % (1 << 31), stops=stops)
                      for (i,), seed in zip(requests, seeds)]
            filled = [[start[i] + j] for i, k in enumerate(ns) for j in range(k)]
        else:
            requests = self._requests(ns)
            bodies = [self._body("ids", [prompts[i] for i in ask], params, (base + int(streams[ask[0]])) % (1 << 31),
                                 ns[ask[0]], stops) for ask in requests]
            filled = [[start[i] + j for i in ask for j in range(ns[i])] for ask in requests]  # choice k x n + j
        with concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool:
            answers = list(pool.map(self._ask, bodies, map(len, filled)))
        rows, cap = int(start[-1]), params.max_new_tokens
        tokens = np.full((rows, cap), self.pad_id, np.int32)
        lengths, truncated = np.zeros(rows, np.int32), np.zeros(rows, bool)
        failed = np.zeros(len(prompts), bool)
        for ask, rows_asked, (answer, retries) in zip(requests, filled, answers):
            self.stats.calls += 1
            self.stats.retries += retries
            self.stats.prefill_tokens += sum(len(prompts[i]) for i in ask)
            if isinstance(answer, RequestFailed):
                self.stats.failed += 1
                self.stats.unanswered += len(rows_asked)
                failed[ask] = True
                counter = FAILURES[answer.kind][0]
                setattr(self.stats, counter, getattr(self.stats, counter) + 1)
                continue
            for row, choice in zip(rows_asked, answer):
                ids = self.tokenizer(choice["text"], add_special_tokens=False).input_ids[:cap]
                stopped = choice.get("finish_reason") == "stop" and len(ids) < cap
                if stopped:  # a finished row ends with its stop token, as the JAX engine's do
                    ids = [*ids, stops[0] if stops else self.pad_id]
                tokens[row, :len(ids)], lengths[row] = ids, len(ids)
                truncated[row] = not stopped
                self.stats.generated_tokens += len(ids)
        return SampleOutput(tokens, np.zeros((rows, cap), np.float32), lengths, truncated), failed

    # -- the protocol -------------------------------------------------------------------------------------------

    def generate(self, prompt_ids: Sequence[Sequence[int]], group_size: int = 1,
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0) -> SampleOutput:
        """`group_size` continuations of each of B prompts: `[B * G, N]` rows, log-probs 0."""
        return self._run([list(map(int, p)) for p in prompt_ids], group_size, params, rng)[0]

    def complete(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix],
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0, *,
                 streams: Sequence[int] | None = None, splits: Sequence[int] | None = None) -> SampleOutput:
        """One continuation of `prefixes[p] + suffix` for each question `(p, suffix)`: `[Q, N]` rows. A question
        asked several times (a pair's votes in one order) is one prompt with `n` samples, sent with the seed of its
        first asking's stream (`streams[q]`, default q), so the server prefills it once; at temperature 0 it is
        asked once (its copies answer alike) and each asking gets that answer. `splits` is the server's business
        (`rrc_jax.serve` finds what a batch's prompts share itself)."""
        streams = range(len(suffixes)) if streams is None else streams
        asked: dict[tuple, list[int]] = {}
        for q, (p, s) in enumerate(suffixes):
            asked.setdefault((*map(int, prefixes[p]), *map(int, s)), []).append(q)
        groups = list(asked.values())
        greedy = params.temperature == 0
        out, failed = self._run([list(k) for k in asked], 1 if greedy else [len(v) for v in groups], params, rng,
                                [streams[v[0]] for v in groups])
        row = np.empty(len(suffixes), np.int64)
        self.last_failed = np.zeros(len(suffixes), bool)
        for g, questions in enumerate(groups):
            self.last_failed[questions] = failed[g]
        if greedy:
            for g, questions in enumerate(groups):
                row[questions] = g
            self.stats.unanswered += sum(len(v) - 1 for v, bad in zip(groups, failed) if bad)  # the copies too
        else:
            row[[q for v in groups for q in v]] = np.arange(len(suffixes))
        return SampleOutput(*(x[row] for x in out))

    def next_token_logprobs(self, prefixes, suffixes, token_ids, *, splits=None) -> np.ndarray:
        raise NotImplementedError("the openai engine cannot read the log-probs of given tokens (the completions API "
                                  "returns its top k only): PRC's P(A) needs --config.inference.engine=jax")
