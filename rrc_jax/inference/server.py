"""A Sampler served over HTTP: an OpenAI-compatible `/v1/completions` endpoint (Starlette, run by uvicorn), so that
a judge can run on its own host or slice while the policy trains elsewhere, asked by the `openai` engine
(`rrc_jax.inference.openai_engine`) or by any OpenAI client. `python -m rrc_jax.serve --model=DIR` serves a
checkpoint with it.

Requests are batched: the endpoint queues each request's prompts and a single batcher takes everything that arrived
within `batch_wait_s` of the first (at most `max_batch` rows), groups it by sampling settings and group size, and
runs each group as one `Sampler.generate` call on one engine thread (the model is never called from two threads),
its prompts padded to a power of two (`row_bucket`: a few compilations serve every batch size). Rows come back to
their requests in order.

The request: `prompt` (a string, a list of strings, a list of token ids or a list of such lists: one prompt each),
`n`, `max_tokens`, `temperature`, `top_p`, `top_k` (-1 or 0: off), `seed`, `stop` (strings: the text is cut at the
first), `stop_token_ids` (default: the model's stop tokens), `skip_special_tokens` (default true), `model` (empty or
the served name). The answer: one choice per prompt and sample, `index` = prompt x n + sample, `text` without the
stop token, `finish_reason` `stop` or `length`, and the `usage` counts. `logprobs` are not served (a 400 naming it).

At temperature 0 a continuation is the greedy one whatever it is batched with. At a temperature > 0 a batch draws
with the seed of its first request, so a sample depends on what it was batched with: reproducible one request at a
time only. Shared prefixes are not reused across requests (every prompt is prefilled; vLLM's prefix caching does
that for a served judge at scale).

Shapes: B prompts of a batch, n samples a prompt, N = `max_tokens`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

from rrc_jax.inference.sampler import Sampler, SampleOutput, SamplingParams

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
except ImportError as e:  # pragma: no cover - the optional extra
    raise ImportError("serving needs the serve extra: pip install 'rrc-jax[serve]' (starlette, uvicorn)") from e


class BadRequest(ValueError):
    """A request the server cannot answer: a 400 with this message (or `status`)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


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


def _number(body: dict, name: str, default, kind):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise BadRequest(f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def _prompts(prompt, tokenizer) -> list[list[int]]:
    """The prompts of a request's `prompt` field, as token ids (`add_special_tokens=False`: a string is tokenized
    as it is, as a template already rendered it)."""
    def ids(p) -> list[int]:
        if isinstance(p, str):
            return tokenizer(p, add_special_tokens=False).input_ids
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            return list(p)
        raise BadRequest("'prompt' must be a string, a list of token ids, or a list of either")

    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest("'prompt' is missing or empty")
    out = [ids(p) for p in prompt]
    if not all(out):
        raise BadRequest("a prompt is empty (it needs at least one token)")
    return out


def parse_completion(body, tokenizer, *, served_name: str, stop_token_ids: Sequence[int],
                     context_length: int | None, vocab_size: int | None = None) -> Completion:
    """A `/v1/completions` body as a `Completion`, or `BadRequest` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("model") not in (None, "", served_name):
        raise BadRequest(f"the model {body['model']!r} is not served here; this server serves {served_name!r}", 404)
    if body.get("logprobs") not in (None, 0, False):
        raise BadRequest("'logprobs' are not served by this server")
    if body.get("stream"):
        raise BadRequest("'stream' is not served by this server")
    prompts = _prompts(body.get("prompt"), tokenizer)
    n, max_tokens = _number(body, "n", 1, int), _number(body, "max_tokens", 16, int)
    top_k = _number(body, "top_k", 0, int)
    stops = body.get("stop_token_ids")
    if stops is not None and not (isinstance(stops, list) and all(isinstance(t, int) for t in stops)):
        raise BadRequest("'stop_token_ids' must be a list of token ids")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a string or a list of non-empty strings")
    if n < 1:
        raise BadRequest(f"'n' must be >= 1, got {n}")
    try:
        params = SamplingParams(temperature=_number(body, "temperature", 1.0, float), top_k=max(top_k, 0),
                                top_p=_number(body, "top_p", 1.0, float), max_new_tokens=max_tokens,
                                stop_token_ids=tuple(stops) if stops is not None else tuple(stop_token_ids))
    except ValueError as e:
        raise BadRequest(str(e)) from None
    for p in prompts:
        if context_length is not None and len(p) + max_tokens > context_length:
            raise BadRequest(f"a prompt of {len(p)} tokens plus max_tokens={max_tokens} exceeds the model's "
                             f"context of {context_length} tokens")
        if vocab_size is not None and not all(0 <= t < vocab_size for t in p):
            raise BadRequest(f"a prompt holds token ids outside the vocabulary [0, {vocab_size})")
    return Completion(tuple(map(tuple, prompts)), n, params, _number(body, "seed", 0, int) % (1 << 31),
                      tuple(stop), bool(body.get("skip_special_tokens", True)))


def choices(completion: Completion, out: SampleOutput, tokenizer) -> list[dict]:
    """The OpenAI choices of a request's rows `[B * n]`: the text without its stop token, cut at the first stop
    string; `finish_reason` `stop` (a stop token or string ended it) or `length`."""
    result = []
    for index, (tokens, length, truncated) in enumerate(zip(out.tokens, out.lengths, out.truncated)):
        ids = tokens[:int(length) - (0 if truncated else 1)].tolist()  # a finished row ends with its stop token
        text = tokenizer.decode(ids, skip_special_tokens=completion.skip_special_tokens)
        cut = min((i for i in (text.find(s) for s in completion.stop) if i >= 0), default=-1)
        finished = not truncated or cut >= 0
        result.append({"index": index, "text": text[:cut] if cut >= 0 else text, "logprobs": None,
                       "finish_reason": "stop" if finished else "length"})
    return result


@dataclasses.dataclass
class ServerStats:
    """What the server did: requests answered, engine calls (`batches`) and the rows they generated."""

    requests: int = 0
    batches: int = 0
    rows: int = 0


def row_bucket(prompts: int, most: int) -> int:
    """The prompts a batch of `prompts` is padded to: the next power of two up to `most` (a call's most prompts),
    beyond it the next multiple of `most`."""
    bucket = 1 << max(prompts - 1, 0).bit_length()
    return bucket if bucket <= most else -(-prompts // most) * most


class Batcher:
    """Batches concurrent requests into `Sampler.generate` calls (the module docstring): `await submit(c)` gives the
    request's rows `[B * n]`. Runs on the server's event loop; the engine runs on one thread of its own."""

    def __init__(self, sampler: Sampler, *, max_batch: int, batch_wait_s: float):
        self.sampler, self.max_batch, self.batch_wait_s = sampler, max_batch, batch_wait_s
        self.stats = ServerStats()
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._engine = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine")

    async def submit(self, completion: Completion) -> SampleOutput:
        if self._queue is None:  # on the serving loop's first request
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._loop())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((completion, future))
        return await future

    async def _loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            rows = batch[0][0].rows
            deadline = time.monotonic() + self.batch_wait_s
            while rows < self.max_batch:
                try:
                    item = await asyncio.wait_for(self._queue.get(), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    break
                batch.append(item)
                rows += item[0].rows
            try:
                await self._run(batch)
            except Exception as e:  # noqa: BLE001 - never leave a request waiting, nor the loop dead
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)

    async def _run(self, batch: list[tuple[Completion, asyncio.Future]]) -> None:
        """Each group of `batch` with the same settings as one engine call; its rows back to each request."""
        groups: dict[tuple, list[tuple[Completion, asyncio.Future]]] = {}
        for item in batch:
            groups.setdefault((item[0].n, item[0].params), []).append(item)
        loop = asyncio.get_running_loop()
        for (n, params), items in groups.items():
            prompts = [p for c, _ in items for p in c.prompts]
            try:
                out = await loop.run_in_executor(self._engine, self._generate, prompts, n, params, items[0][0].seed)
            except Exception as e:  # the engine failed: every request of the group gets a 500
                for _, future in items:
                    if not future.done():
                        future.set_exception(e)
                continue
            self.stats.batches += 1
            self.stats.rows += len(prompts) * n
            start = 0
            for c, future in items:
                stop = start + c.rows
                if not future.done():  # (a client that went away)
                    future.set_result(SampleOutput(*(x[start:stop] for x in out)))
                start = stop

    def _generate(self, prompts, n, params, seed) -> SampleOutput:
        """`Sampler.generate` of `prompts` padded (with copies of the first) to `row_bucket` prompts, so that batches
        of any size share a few compilations; the padding's rows are dropped. (The JAX engine runs each call on its
        model's mesh itself.)"""
        padded = prompts + [prompts[0]] * (row_bucket(len(prompts), max(1, self.max_batch // n)) - len(prompts))
        out = self.sampler.generate(padded, n, params, rng=seed)
        return SampleOutput(*(x[:len(prompts) * n] for x in out))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._engine.shutdown(wait=False, cancel_futures=True)


def make_app(sampler: Sampler, tokenizer, *, served_name: str = "rrc-jax", max_batch: int = 64,
             batch_wait_s: float = 0.005, vocab_size: int | None = None) -> Starlette:
    """The ASGI app serving `sampler` (its `tokenizer` turns texts to ids and back): `POST /v1/completions`,
    `GET /v1/models`, `GET /health` (with the `ServerStats`). `app.state.batcher` is its `Batcher`."""
    if max_batch < 1 or batch_wait_s < 0:
        raise ValueError(f"make_app: need max_batch >= 1 and batch_wait_s >= 0, got {max_batch}, {batch_wait_s}")
    batcher = Batcher(sampler, max_batch=max_batch, batch_wait_s=batch_wait_s)

    async def completions(request: Request) -> JSONResponse:
        try:
            try:
                body = await request.json()
            except ValueError:
                raise BadRequest("the body is not JSON") from None
            completion = parse_completion(body, tokenizer, served_name=served_name,
                                          stop_token_ids=sampler.stop_token_ids,
                                          context_length=sampler.context_length, vocab_size=vocab_size)
        except BadRequest as e:
            return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error"}}, e.status)
        try:
            out = await batcher.submit(completion)
        except Exception as e:  # noqa: BLE001 - the engine's failure, reported to the client
            return JSONResponse({"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error"}}, 500)
        batcher.stats.requests += 1
        prompt_tokens = sum(map(len, completion.prompts))
        completion_tokens = int(out.lengths.sum())
        return JSONResponse({
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": served_name, "choices": choices(completion, out, tokenizer),
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
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_level="warning", limit_max_requests=limit_max_requests,
                                         timeout_graceful_shutdown=5))


@contextlib.contextmanager
def serving(app, *, host: str = "127.0.0.1", limit_max_requests: int | None = None) -> Iterator[str]:
    """Serve `app` on a free port of `host` in a background thread for the `with` block; yields the base URL
    (`http://host:port`). The server stops at the block's end, or after `limit_max_requests` requests."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    server = uvicorn_server(app, limit_max_requests=limit_max_requests)
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

