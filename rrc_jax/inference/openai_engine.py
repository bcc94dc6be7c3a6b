"""An inference engine over HTTP: the Sampler protocol (`rrc_jax.inference.sampler`) answered by an
OpenAI-compatible `/v1/completions` endpoint (vLLM, SGLang, TGI, JetStream), so that a judge need not live in the
trainer's process.

Each question of `complete` (and each prompt of `generate`, with `n` = the group size) is one request whose
`prompt` is its token ids, which vLLM and SGLang take as they are (nothing is tokenized again on the server), sent
by `concurrency` threads. Reusing the prefix many questions share (the judge's `[instruction, prompt]`) is the
server's business: vLLM's automatic prefix caching does it, and so this engine has no `prefix_reuse`.

Failures are abstentions, never a crash and never a silent zero. A request that fails (refused or dropped
connection, an HTTP error, a body that is not a completion) is retried `retries` times after `backoff_s`, doubling;
one whose every attempt failed, or that outlived `timeout_s` (each attempt's limit), gives an empty continuation
(length 0), in which the judge's parser finds no verdict and counts an abstention. `stats.failed` counts those
questions and `stats.timeouts` those whose last attempt timed out (the judge logs them as `judge/failed_requests`
and `judge/timeouts`); `stats.retries` counts the attempts made again.

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
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

import jax
import numpy as np

from rrc_jax.inference.sampler import SampleOutput, SamplerStats, SamplingParams, Suffix, stop_tokens

# Options the callers pass to every engine that only the JAX engine uses: the server batches, places and reuses
# prefixes itself.
JAX_ENGINE_OPTIONS = ("max_batch", "prefix_reuse", "layout")


@dataclasses.dataclass
class HttpStats(SamplerStats):
    """`SamplerStats` plus what went wrong: questions (or prompts) without an answer (`failed`), those whose last
    attempt timed out (`timeouts`, a part of `failed`), and attempts made again (`retries`)."""

    failed: int = 0
    timeouts: int = 0
    retries: int = 0

    def failures(self) -> dict[str, int]:
        return {"failed_requests": self.failed, "timeouts": self.timeouts}


class RequestFailed(Exception):
    """One request's last attempt failed; `timed_out` when it outlived the timeout."""

    def __init__(self, message: str, timed_out: bool):
        super().__init__(message)
        self.timed_out = timed_out


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
      role: the role it samples for (`rrc_jax.rl.roles.ROLES`).
      url: the server's base URL, e.g. `http://10.0.0.2:8000` (`/v1/completions` is appended).
      api_model: the model name the server serves (the request's `model`).
      concurrency: requests in flight at once.
      timeout_s: each attempt's limit, connection and answer included.
      retries: attempts after the first; `backoff_s` before the first of them, doubling.
      context_length: the most tokens a row may hold on the server (default: the model's positions; None when
        unknown: nothing is checked here).
    """

    def __init__(self, model=None, tokenizer=None, *, role: str = "grm", url: str = "", api_model: str = "",
                 concurrency: int = 16, timeout_s: float = 60.0, retries: int = 2, backoff_s: float = 0.5,
                 stop_token_ids: Sequence[int] | None = None, pad_id: int | None = None,
                 context_length: int | None = None, **jax_engine_options):
        unknown = sorted(set(jax_engine_options) - set(JAX_ENGINE_OPTIONS))
        if unknown:
            raise TypeError(f"OpenAISampler: unknown options {', '.join(unknown)}")
        if not url:
            raise ValueError("OpenAISampler: url is empty; give the server's base URL, e.g. http://127.0.0.1:8000")
        if tokenizer is None:
            raise ValueError("OpenAISampler: a tokenizer is needed (token ids are sent, texts come back)")
        if concurrency < 1 or timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError(f"OpenAISampler: need concurrency >= 1, timeout_s > 0, retries >= 0, backoff_s >= 0; "
                             f"got {concurrency}, {timeout_s}, {retries}, {backoff_s}")
        self.tokenizer, self.role = tokenizer, role
        self.endpoint = url.rstrip("/") + "/v1/completions"
        self.api_model = api_model
        self.concurrency, self.timeout_s, self.retries, self.backoff_s = concurrency, timeout_s, retries, backoff_s
        cfg = getattr(model, "cfg", model)  # a Decoder's config, or the config itself
        if stop_token_ids is None:
            stop_token_ids = stop_tokens(cfg.eos_token_ids if cfg is not None else (), tokenizer)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.pad_id = int(pad_id if pad_id is not None else (getattr(tokenizer, "pad_token_id", None) or 0))
        if context_length is None and cfg is not None:
            context_length = int(cfg.max_position_embeddings)
        self.context_length = context_length
        self.stats = HttpStats()

    def update_weights(self, params) -> int:
        """The server holds its own weights: nothing is synced here (a judge's weights do not change)."""
        return 0

    # -- one request --------------------------------------------------------------------------------------------

    def _post(self, body: dict) -> dict:
        """One attempt: the parsed JSON answer, or `RequestFailed`."""
        request = urllib.request.Request(self.endpoint, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                answer = json.loads(response.read())
        except TimeoutError as e:
            raise RequestFailed(f"timed out after {self.timeout_s} s", timed_out=True) from e
        except urllib.error.URLError as e:
            timed_out = isinstance(e.reason, TimeoutError)
            raise RequestFailed(f"{type(e).__name__}: {e.reason}", timed_out=timed_out) from e
        except (OSError, ValueError) as e:  # a dropped connection, a body that is not JSON
            raise RequestFailed(f"{type(e).__name__}: {e}", timed_out=False) from e
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices or not all(
                isinstance(c, dict) and isinstance(c.get("text"), str) for c in choices):
            raise RequestFailed(f"not a completion: {str(answer)[:200]}", timed_out=False)
        return answer

    def _ask(self, body: dict) -> tuple[list[dict] | RequestFailed, int]:
        """A request with its retries: the answer's choices (sorted by index), or the last attempt's failure; and
        the attempts made again."""
        wait = self.backoff_s
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(wait)
                wait *= 2
            try:
                answer = self._post(body)
            except RequestFailed as failure:
                last = failure
                continue
            return sorted(answer["choices"], key=lambda c: c.get("index", 0)), attempt
        return last, self.retries

    def _run(self, prompts: list[list[int]], n: int, params: SamplingParams, rng) -> SampleOutput:
        """`n` continuations of each prompt, rows `i*n ... i*n + n - 1` for prompt i."""
        base = _seed(rng)
        stops = params.stop_token_ids if params.stop_token_ids is not None else self.stop_token_ids
        bodies = [{"model": self.api_model, "prompt": prompt, "n": n, "max_tokens": params.max_new_tokens,
                   "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k or -1,
                   "seed": (base + i) % (1 << 31), "stop_token_ids": list(stops), "skip_special_tokens": True}
                  for i, prompt in enumerate(prompts)]
        with concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool:
            answers = list(pool.map(self._ask, bodies))
        rows, cap = len(prompts) * n, params.max_new_tokens
        tokens = np.full((rows, cap), self.pad_id, np.int32)
        lengths, truncated = np.zeros(rows, np.int32), np.zeros(rows, bool)
        for i, (answer, retries) in enumerate(answers):
            self.stats.calls += 1
            self.stats.retries += retries
            self.stats.prefill_tokens += len(prompts[i])
            if isinstance(answer, RequestFailed):
                self.stats.failed += 1
                self.stats.timeouts += int(answer.timed_out)
                continue
            for j, choice in enumerate(answer[:n]):
                ids = self.tokenizer(choice["text"], add_special_tokens=False).input_ids[:cap]
                stopped = choice.get("finish_reason") == "stop" and len(ids) < cap
                if stopped:  # a finished row ends with its stop token, as the JAX engine's do
                    ids = [*ids, stops[0] if stops else self.pad_id]
                row = i * n + j
                tokens[row, :len(ids)], lengths[row] = ids, len(ids)
                truncated[row] = not stopped
                self.stats.generated_tokens += len(ids)
        return SampleOutput(tokens, np.zeros((rows, cap), np.float32), lengths, truncated)

    # -- the protocol -------------------------------------------------------------------------------------------

    def generate(self, prompt_ids: Sequence[Sequence[int]], group_size: int = 1,
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0) -> SampleOutput:
        """`group_size` continuations of each of B prompts: `[B * G, N]` rows, log-probs 0."""
        return self._run([list(map(int, p)) for p in prompt_ids], group_size, params, rng)

    def complete(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Suffix],
                 params: SamplingParams = SamplingParams(), rng: jax.Array | int = 0) -> SampleOutput:
        """One continuation of `prefixes[p] + suffix` for each question `(p, suffix)`: `[Q, N]` rows."""
        prompts = [list(map(int, prefixes[p])) + list(map(int, s)) for p, s in suffixes]
        return self._run(prompts, 1, params, rng)

    def next_token_logprobs(self, prefixes, suffixes, token_ids) -> np.ndarray:
        raise NotImplementedError("the openai engine cannot read the log-probs of given tokens (the completions API "
                                  "returns its top k only): PRC's P(A) needs --config.inference.engine=jax")
