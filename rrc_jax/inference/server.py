"""A Sampler served over HTTP: an OpenAI-compatible `/v1/completions` endpoint (Starlette, run by uvicorn), so that
a judge can run on its own host or slice while the policy trains elsewhere, asked by the `openai` engine
(`rrc_jax.inference.openai_engine`) or by any OpenAI client. `python -m rrc_jax.serve --model=DIR` serves a
checkpoint with it.

Requests are batched and share the engine fairly. A request's B x n rows are cut into chunks of at most `max_batch`
rows (whole prompts of n samples, or, when n exceeds `max_batch`, one prompt's samples in parts). A single batcher
takes the requests that arrived within `batch_wait_s` of the first and, round after round, the next chunk of each
request, the least recently served first (while they fit in `max_batch` rows and share sampling settings; any
`n`). Each round is one `Sampler.complete` call on one engine thread (the model is never called from two threads):
the round's prompts as questions after the prefixes they share (`question_tree.shared_prefixes`: a judge's
questions about one prompt share its instruction and prompt, those that show one response first that response too,
and a request's n samples the whole question), each shared part prefilled once for the round; `rrc_jax.serve`'s
engine runs it in chunk shapes it has compiled (`JaxSampler(reuse_shapes=True)`). So one request of n = 100,000
runs as many calls, and a request that arrives meanwhile goes before the next of them. Rows come back to their
requests in order. A request whose client has disconnected is dropped before its next chunk reaches the engine and
is not counted as answered (`ServerStats.disconnected`).

The request: `prompt` (a string, a list of strings, a list of token ids or a list of such lists: one prompt each),
`n`, `max_tokens`, `temperature`, `top_p`, `top_k` (-1 or 0: off), `seed`, `stop` (strings: the text is cut at the
first), `stop_token_ids` (default: the model's stop tokens), `skip_special_tokens` (default true), `model` (empty or
the served name), `user`. A field of the wrong type or out of range is a 400 naming it, and so is a text that is not
valid Unicode (a lone surrogate) or a text prompt longer than the model's context could hold in characters (refused
before it is tokenized); JSON nested too deeply is a 400 too, a body over `max_body_bytes` a 413 (read no further
than the limit: `read_body`). OpenAI parameters the server does not apply (`echo`, `best_of`, `presence_penalty`,
`frequency_penalty`, `suffix`, `logit_bias`, `logprobs`, `stream`, ...) are a 400 naming them unless they hold their
neutral value (`echo: false`, `presence_penalty: 0`, ...); any other field is a 400 too: nothing a client asks for
is silently ignored. The answer: one choice per prompt and sample, `index` = prompt x n + sample, `text` without the
stop token, `finish_reason` `stop` or `length`, and the `usage` counts (`completion_tokens`: the tokens of the texts
returned).

At temperature 0 a continuation is the greedy one whatever it is batched with. At a temperature > 0 sample j of
a chunk's prompt k draws from its own stream of the chunk's seed (a request's seed, plus the chunk's index within
it): a request's samples are the same whatever it is batched with.

Shapes: B prompts of a request, n samples a prompt, N = `max_tokens`, R rows of an engine call (at most
`max_batch`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import math
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

import numpy as np

from rrc_jax.inference.question_tree import shared_prefixes
from rrc_jax.inference.sampler import Sampler, SampleOutput, SamplingParams

try:
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
except ImportError as e:  # pragma: no cover - the optional extra
    raise ImportError("serving needs the serve extra: pip install 'rrc-jax[serve]' (starlette, uvicorn)") from e


class BadRequest(ValueError):
    """A request the server cannot answer: a 400 with this message (or `status`)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class BodyTooLarge(ValueError):
    """A request body over `limit` bytes: `size` its bytes as far as they were read (its Content-Length when it gave
    one, else those read when the limit was passed: a lower bound)."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"the body holds at least {size} bytes, more than the {limit} taken")
        self.size, self.limit = size, limit


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body of `request`, read as it streams in: `BodyTooLarge` once it passes `max_bytes`, reading nothing more
    (nothing at all when its Content-Length does). A client gone mid-body raises Starlette's `ClientDisconnect`."""
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > max_bytes:
        raise BodyTooLarge(int(size), max_bytes)
    chunks, seen = [], 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > max_bytes:
            raise BodyTooLarge(seen, max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def quoted(value, limit: int = 80) -> str:
    """A client's `value` quoted for a message: its `ascii()` (nothing that cannot be encoded), at most `limit`
    characters of it."""
    try:
        text = ascii(value)
    except (RecursionError, ValueError):  # nested too deeply; an int too long to print
        return f"<a {type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def longest_token_chars(tokenizer) -> int | None:
    """The most characters of text one token of `tokenizer` stands for: its vocabulary's longest entry (a byte-level
    entry spells a byte a character, so it is never shorter than the text it covers); None when the vocabulary is
    unknown."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError, TypeError):
        return None
    return max(map(len, vocab), default=0) or None


@dataclasses.dataclass(frozen=True)
class Completion:
    """One parsed request: its prompts `[B]` (token ids), `n` samples each, the sampling settings, the seed, the
    stop strings and whether special tokens are dropped from the texts."""

    prompts: tuple[tuple[int, ...], ...]
    n: int
    params: SamplingParams
    seed: int
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True

    @property
    def rows(self) -> int:
        """The rows it asks for: B x n."""
        return len(self.prompts) * self.n


# The fields a request may hold: those applied, and those of OpenAI's API (and vLLM's) that are not, with the
# neutral values that ask for nothing (any other value is a 400 naming the field).
APPLIED = ("model", "prompt", "n", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
           "skip_special_tokens", "user")
NOT_APPLIED = {"echo": (False,), "best_of": (1,), "presence_penalty": (0,), "frequency_penalty": (0,),
               "repetition_penalty": (1,), "suffix": ("",), "logit_bias": ({},), "logprobs": (0, False),
               "stream": (False,), "stream_options": (), "min_p": (0,), "min_tokens": (0,), "ignore_eos": (False,),
               "include_stop_str_in_output": (False,), "response_format": ()}
MAX_REQUEST_TOKENS = 1 << 24  # rows x max_tokens of one request (64 MiB of token ids): its answer is held at once


def _number(body: dict, name: str, default, kind, least=None):
    """Field `name` of `body` as `kind` (int or float; `default` when absent or null), a 400 naming it unless it is
    such a number (finite, >= `least` when given)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or isinstance(value, float) and (
            not math.isfinite(value) or kind is int and not value.is_integer()):
        raise BadRequest(f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {quoted(value)}")
    if least is not None and value < least:
        raise BadRequest(f"'{name}' must be >= {least}, got {quoted(value)}")
    try:
        return kind(value)
    except OverflowError:  # an integer past a float's range
        raise BadRequest(f"'{name}' is out of range, got {quoted(value)}") from None


def _check_fields(body: dict) -> None:
    """A 400 naming the first field that is neither applied nor a not-applied OpenAI parameter at its neutral
    value (`APPLIED`, `NOT_APPLIED`)."""
    for name, value in body.items():
        if name in APPLIED:
            continue
        if name not in NOT_APPLIED:
            raise BadRequest(f"{quoted(name)} is not a parameter this server knows; remove it (it applies "
                             f"{', '.join(APPLIED)})")
        neutral = value is None or any(value == v and isinstance(value, bool) == isinstance(v, bool)
                                       for v in NOT_APPLIED[name]) or (
            name == "best_of" and value == body.get("n", 1) and not isinstance(value, bool))
        if not neutral:
            raise BadRequest(f"'{name}' is not applied by this server (got {quoted(value)}); remove it")


def _token_ids(value, name: str, vocab_size: int | None) -> list[int]:
    """A list of token ids in `[0, vocab_size)`, or a 400 naming `name`."""
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise BadRequest(f"'{name}' must be a list of token ids (integers), got {quoted(value)}")
    top = vocab_size if vocab_size is not None else 1 << 31
    bad = [t for t in value if not 0 <= t < top]
    if bad:
        raise BadRequest(f"'{name}' holds token ids outside the vocabulary [0, {top}): {quoted(bad[:4])}")
    return value


def _text(value: str, name: str) -> str:
    """`value`, or a 400 naming `name` unless it is valid Unicode (no lone surrogate: a JSON escape can send one)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRequest(f"{name} is not valid Unicode: it holds a lone surrogate, {quoted(value[e.start:e.end])} at "
                         f"character {e.start}; send UTF-8 text") from None
    return value


def _prompt_list(prompt) -> list:
    """The prompts of a request's `prompt` field, as sent (strings and lists of token ids): one prompt or a list."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest("'prompt' is missing or empty")
    return prompt


def _prompts(prompts: list, tokenizer, vocab_size: int | None, max_chars: int | None = None,
             context_length: int | None = None) -> list[list[int]]:
    """`_prompt_list`'s prompts as token ids (`add_special_tokens=False`: a string is tokenized as it is, as a
    template already rendered it). A string over `max_chars` characters cannot fit the context (`context_length`
    tokens): a 400 naming it, before anything is tokenized."""
    def name(i: int) -> str:
        return "'prompt'" if len(prompts) == 1 else f"'prompt'[{i}]"

    for i, p in enumerate(prompts):
        if isinstance(p, str):
            _text(p, name(i))
            if max_chars is not None and len(p) > max_chars:
                raise BadRequest(f"{name(i)} holds {len(p)} characters, more than the model's context of "
                                 f"{context_length} tokens can hold ({max_chars} characters: "
                                 f"{max_chars // context_length} a token at most); shorten it")
        elif not (isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)):
            raise BadRequest("'prompt' must be a string, a list of token ids, or a list of either")
    out = [tokenizer(p, add_special_tokens=False).input_ids if isinstance(p, str)
           else _token_ids(p, "prompt", vocab_size) for p in prompts]
    if not all(out):
        raise BadRequest("a prompt is empty (it needs at least one token)")
    return out


def parse_completion(body, tokenizer, *, served_name: str, stop_token_ids: Sequence[int],
                     context_length: int | None, vocab_size: int | None = None,
                     max_token_chars: int | None = None) -> Completion:
    """A `/v1/completions` body as a `Completion`, or `BadRequest` naming the field (the module docstring). Its text
    prompts are tokenized last, after every other check; one of more than `context_length` x `max_token_chars`
    characters (`longest_token_chars`; None: unknown) is refused before."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    _check_fields(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {quoted(model)}")
    if model not in (None, "", served_name):
        raise BadRequest(f"the model {quoted(model)} is not served here; this server serves {served_name!r}", 404)
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise BadRequest(f"'user' must be a string, got {quoted(body['user'])}")
    prompts = _prompt_list(body.get("prompt"))
    n, max_tokens = _number(body, "n", 1, int, least=1), _number(body, "max_tokens", 16, int, least=1)
    top_k = _number(body, "top_k", 0, int, least=-1)
    stops = body.get("stop_token_ids")
    stops = _token_ids(stops, "stop_token_ids", vocab_size) if stops is not None else None
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a string or a list of non-empty strings")
    for s in stop:
        _text(s, "'stop'")
    skip = body.get("skip_special_tokens", True)
    if not isinstance(skip, bool):
        raise BadRequest(f"'skip_special_tokens' must be true or false, got {quoted(skip)}")
    if n * len(prompts) * max_tokens > MAX_REQUEST_TOKENS:
        raise BadRequest(f"'n' x prompts x 'max_tokens' = {quoted(n)} x {len(prompts)} x {quoted(max_tokens)} "
                         f"exceeds the {MAX_REQUEST_TOKENS} tokens one request may ask for; split it into several "
                         "requests")
    try:
        params = SamplingParams(temperature=_number(body, "temperature", 1.0, float),
                                top_k=max(top_k, 0), top_p=_number(body, "top_p", 1.0, float),
                                max_new_tokens=max_tokens,
                                stop_token_ids=tuple(stops) if stops is not None else tuple(stop_token_ids))
    except ValueError as e:
        raise BadRequest(str(e)) from None
    max_chars = context_length * max_token_chars if context_length is not None and max_token_chars else None
    prompts = _prompts(prompts, tokenizer, vocab_size, max_chars, context_length)
    for p in prompts:
        if context_length is not None and len(p) + max_tokens > context_length:
            raise BadRequest(f"a prompt of {len(p)} tokens plus max_tokens={max_tokens} exceeds the model's "
                             f"context of {context_length} tokens")
    return Completion(tuple(map(tuple, prompts)), n, params, _number(body, "seed", 0, int) % (1 << 31),
                      tuple(stop), skip)


def _returned_tokens(tokenizer, ids: list[int], skip: bool, chars: int) -> int:
    """The fewest of `ids` whose text holds the first `chars` characters: the tokens of a text cut at a stop
    string (a binary search over prefixes; a decoded prefix grows with its tokens)."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=skip)) >= chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


def choices(completion: Completion, out: SampleOutput, tokenizer) -> tuple[list[dict], int]:
    """The OpenAI choices of a request's rows `[B * n]`: the text without its stop token, cut at the first stop
    string; `finish_reason` `stop` (a stop token or string ended it) or `length`. And the tokens of the texts
    returned (`usage.completion_tokens`: without the stop token, and only up to a stop string)."""
    result, returned = [], 0
    skip = completion.skip_special_tokens
    for index, (tokens, length, truncated) in enumerate(zip(out.tokens, out.lengths, out.truncated)):
        ids = tokens[:int(length) - (0 if truncated else 1)].tolist()  # a finished row ends with its stop token
        text = tokenizer.decode(ids, skip_special_tokens=skip)
        cut = min((i for i in (text.find(s) for s in completion.stop) if i >= 0), default=-1)
        finished = not truncated or cut >= 0
        returned += _returned_tokens(tokenizer, ids, skip, cut) if cut >= 0 else len(ids)
        result.append({"index": index, "text": text[:cut] if cut >= 0 else text, "logprobs": None,
                       "finish_reason": "stop" if finished else "length"})
    return result, returned


@dataclasses.dataclass
class ServerStats:
    """What the server did: requests answered, requests dropped because their client disconnected first, engine
    calls (`batches`) and the rows they generated."""

    requests: int = 0
    disconnected: int = 0
    batches: int = 0
    rows: int = 0


@dataclasses.dataclass
class Chunk:
    """A part of a request run in one engine call: `prompts` with `n` samples each, the `seed` it draws with."""

    prompts: list[tuple[int, ...]]
    n: int
    seed: int

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n


class Job:
    """One request's work: its `Completion` cut lazily into chunks of at most `max_batch` rows (whole prompts, or one
    prompt's samples in parts when `n > max_batch`), the rows that came back, and the future its handler awaits."""

    def __init__(self, completion: Completion, max_batch: int, future: asyncio.Future):
        self.completion, self.max_batch, self.future = completion, max_batch, future
        self.parts: list[SampleOutput] = []
        self.cancelled = False
        self.last = 0  # the batcher's round that last served it (`Batcher._round`)
        self._prompt, self._sample, self._chunks = 0, 0, 0

    @property
    def pending(self) -> bool:
        """Whether chunks remain to be run (not once cancelled)."""
        return not self.cancelled and self._prompt < len(self.completion.prompts)

    def peek(self) -> Chunk:
        """The next chunk (`pending` must hold); `take` moves past it."""
        c = self.completion
        if c.n <= self.max_batch:
            prompts, n = list(c.prompts[self._prompt:self._prompt + self.max_batch // c.n]), c.n
        else:
            prompts, n = [c.prompts[self._prompt]], min(self.max_batch, c.n - self._sample)
        return Chunk(prompts, n, (c.seed + self._chunks) % (1 << 31))

    def take(self) -> Chunk:
        chunk = self.peek()
        self._chunks += 1
        if self.completion.n <= self.max_batch:
            self._prompt += len(chunk.prompts)
        else:
            self._sample += chunk.n
            if self._sample == self.completion.n:
                self._prompt, self._sample = self._prompt + 1, 0
        return chunk

    def add(self, out: SampleOutput) -> None:
        """A chunk's rows (chunks come back in the order taken); the answer once every chunk has."""
        self.parts.append(out)
        if not self.pending and not self.future.done():
            self.future.set_result(SampleOutput(*(np.concatenate(x) for x in zip(*self.parts))))


class Batcher:
    """Runs concurrent requests' chunks as `Sampler.complete` calls (the module docstring): `submit(c)` gives the
    request's `Job`, whose `future` resolves to its rows `[B * n]`. Runs on the server's event loop; the engine runs
    on one thread of its own."""

    def __init__(self, sampler: Sampler, *, max_batch: int, batch_wait_s: float):
        self.sampler, self.max_batch, self.batch_wait_s = sampler, max_batch, batch_wait_s
        self.stats = ServerStats()
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._engine = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine")

    def submit(self, completion: Completion) -> Job:
        loop = asyncio.get_running_loop()
        if self._queue is None:  # on the serving loop's first request
            self._queue = asyncio.Queue()
            self._task = loop.create_task(self._loop())
        job = Job(completion, self.max_batch, loop.create_future())
        self._queue.put_nowait(job)
        return job

    async def _loop(self) -> None:
        active: list[Job] = []
        rounds = 0
        while True:
            if not active:  # idle: the first arrival, then what comes within batch_wait_s of it
                first = await self._queue.get()
                first.last, new = rounds - 1, [first]
                deadline = time.monotonic() + self.batch_wait_s
                while sum(j.peek().rows for j in new) < self.max_batch:
                    try:
                        new.append(await asyncio.wait_for(self._queue.get(), max(0.0, deadline - time.monotonic())))
                    except asyncio.TimeoutError:
                        break
                    new[-1].last = rounds - 1
                active += new
            while not self._queue.empty():  # arrivals during the last call: ahead of the jobs it served
                job = self._queue.get_nowait()
                job.last = rounds - 2
                active.append(job)
            active = [j for j in active if j.pending]  # (the cancelled: their clients went away)
            if not active:
                continue
            batch = self._round(active, rounds)
            rounds += 1
            try:
                await self._run(batch)
            except Exception as e:  # noqa: BLE001 - the engine failed: its requests get a 500, the loop goes on
                for job, _ in batch:
                    job.cancelled = True
                    if not job.future.done():
                        job.future.set_exception(e)

    def _round(self, active: list[Job], number: int) -> list[tuple[Job, Chunk]]:
        """Round `number`'s chunks: the next chunk of each active job, the least recently served first (a job that
        arrived during the last call counts as served before it), while they share the first's sampling settings
        (any `n`) and fit in `max_batch` rows. Every job waits at most a call behind another's."""
        active.sort(key=lambda j: j.last)  # stable: arrival order among equals
        key, rows, batch = active[0].completion.params, 0, []
        for job in active:
            chunk = job.peek()
            if job.completion.params == key and rows + chunk.rows <= self.max_batch:
                batch.append((job, job.take()))
                job.last = number
                rows += chunk.rows
        return batch

    async def _run(self, batch: list[tuple[Job, Chunk]]) -> None:
        """The chunks of `batch` as one engine call; each chunk's rows back to its job."""
        prompts = [p for _, chunk in batch for p in chunk.prompts]
        ns = [chunk.n for _, chunk in batch for _ in chunk.prompts]
        seeds = [chunk.seed for _, chunk in batch for _ in chunk.prompts]
        places = [k for _, chunk in batch for k in range(len(chunk.prompts))]
        out = await asyncio.get_running_loop().run_in_executor(self._engine, self._complete, prompts, ns,
                                                               batch[0][0].completion.params, seeds, places)
        self.stats.batches += 1
        self.stats.rows += sum(ns)
        start = 0
        for job, chunk in batch:
            stop = start + chunk.rows
            if not job.cancelled:
                job.add(SampleOutput(*(x[start:stop] for x in out)))
            start = stop

    def _complete(self, prompts, ns, params, seeds, places) -> SampleOutput:
        """The round's `ns[i]` samples of each prompt i as `Sampler.complete` questions after the prefixes the
        prompts share (`question_tree.shared_prefixes`: each shared part prefilled once for the whole round),
        sample j of a chunk's prompt k drawing from a stream of its chunk's seed alone, whatever it is batched
        with. (The JAX engine runs each call on its model's mesh itself.)"""
        prefixes, suffixes, splits = shared_prefixes(prompts)
        asked = [(i, j) for i, n in enumerate(ns) for j in range(n)]
        streams = [(seeds[i] * 1_000_003 + places[i] * ns[i] + j) % (1 << 32) for i, j in asked]
        return self.sampler.complete(prefixes, [suffixes[i] for i, _ in asked], params, rng=0, streams=streams,
                                     splits=[splits[i] for i, _ in asked])

    def close(self) -> None:
        """Stop taking rounds and wait for the one in flight: the model is not left running in a thread of its own
        after the server stops (the process may go on using it, or JAX, meanwhile)."""
        if self._task is not None:
            self._task.cancel()
        self._engine.shutdown(wait=True, cancel_futures=True)


async def _disconnected(receive) -> None:
    """Returns once the client of a request whose body was read has disconnected (ASGI `http.disconnect`)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _error(message: str, status: int, kind: str = "invalid_request_error") -> JSONResponse:
    message = message.encode("utf-8", "backslashreplace").decode()  # (a lone surrogate cannot be sent)
    return JSONResponse({"error": {"message": message, "type": kind}}, status)


def make_app(sampler: Sampler, tokenizer, *, served_name: str = "rrc-jax", max_batch: int = 64,
             batch_wait_s: float = 0.005, vocab_size: int | None = None, max_body_bytes: int = 16 << 20) -> Starlette:
    """The ASGI app serving `sampler` (its `tokenizer` turns texts to ids and back): `POST /v1/completions`,
    `GET /v1/models`, `GET /health` (with the `ServerStats`). A body over `max_body_bytes` is a 413, read no
    further (`read_body`). `app.state.batcher` is its `Batcher`."""
    if max_batch < 1 or not batch_wait_s >= 0 or max_body_bytes < 1:
        raise ValueError(f"make_app: need max_batch >= 1, batch_wait_s >= 0 and max_body_bytes >= 1, got "
                         f"{max_batch}, {batch_wait_s}, {max_body_bytes}")
    batcher = Batcher(sampler, max_batch=max_batch, batch_wait_s=batch_wait_s)
    token_chars = longest_token_chars(tokenizer)  # (a text prompt's most characters: context x this)

    async def completions(request: Request) -> Response:
        try:
            try:
                body = json.loads(await read_body(request, max_body_bytes))
            except BodyTooLarge as e:
                raise BadRequest(f"the body ({e.size} bytes or more) exceeds the server's limit of {e.limit} bytes "
                                 "(rrc_jax.serve --max_body_mb); send fewer or shorter prompts a request",
                                 413) from None
            except RecursionError:
                raise BadRequest("the body's JSON is nested too deeply") from None
            except ValueError:
                raise BadRequest("the body is not JSON") from None
            try:
                completion = parse_completion(body, tokenizer, served_name=served_name,
                                              stop_token_ids=sampler.stop_token_ids,
                                              context_length=sampler.context_length, vocab_size=vocab_size,
                                              max_token_chars=token_chars)
            except RecursionError:  # (a field nested too deeply to compare or quote)
                raise BadRequest("the body's JSON is nested too deeply") from None
        except BadRequest as e:
            return _error(str(e), e.status)
        except ClientDisconnect:  # the client went away mid-body: nothing to answer, nothing to log
            return Response(status_code=400)
        job = batcher.submit(completion)
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait({job.future, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not job.future.done():  # disconnected: its chunks never reach the engine
            job.cancelled = True
            batcher.stats.disconnected += 1
            return Response(status_code=499)
        if job.future.exception() is not None:  # the engine's failure, reported to the client
            e = job.future.exception()
            return _error(f"{type(e).__name__}: {e}", 500, "server_error")
        out = job.future.result()
        batcher.stats.requests += 1
        prompt_tokens = sum(map(len, completion.prompts))
        answers, completion_tokens = choices(completion, out, tokenizer)
        return JSONResponse({
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": served_name, "choices": answers,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": served_name, "object": "model",
                                                         "owned_by": "rrc-jax",
                                                         "max_model_len": sampler.context_length}]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", **dataclasses.asdict(batcher.stats)})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        batcher.close()

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/v1/models", models),
                            Route("/health", health)], lifespan=lifespan)
    app.state.batcher = batcher
    return app


def uvicorn_server(app, *, limit_max_requests: int | None = None):
    """The uvicorn server of `app` (logs at warning level), to `run(sockets=[...])` or `run()` after setting
    `config.host` / `config.port`."""
    import uvicorn  # the serve extra

    return uvicorn.Server(uvicorn.Config(app, log_level="warning", limit_max_requests=limit_max_requests,
                                         timeout_graceful_shutdown=5))


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host:port` (0: a free port), for `uvicorn_server(...).run(sockets=[it])`: binding
    first tells a busy port (`OSError`) before anything loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


@contextlib.contextmanager
def serving(app, *, host: str = "127.0.0.1", port: int = 0, limit_max_requests: int | None = None,
            server=None) -> Iterator[str]:
    """Serve `app` on `host:port` (0: a free port) in a background thread for the `with` block; yields the base URL
    (`http://host:port`). The server (`server`, default `uvicorn_server(app)`) stops at the block's end, or after
    `limit_max_requests` requests."""
    sock = bind(host, port)
    server = server or uvicorn_server(app, limit_max_requests=limit_max_requests)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="uvicorn")
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server stopped while starting")
            time.sleep(0.01)
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
