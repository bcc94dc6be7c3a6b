"""Where every sampler comes from: `make_sampler(role, model, ...)` builds the Sampler of one role of a run (the
policy's rollout, the reference's anchors, the GRM's judge) with the engine the run's `inference` group names.

`ENGINES` maps an engine's name to its constructor `(model, tokenizer, *, role, **options) -> Sampler`:

- `jax` (`rrc_jax.inference.engine.JaxSampler`; options `max_batch`, `prefix_reuse`, `stop_token_ids`, `pad_id`,
  `layout`): every role.
- `openai` (`rrc_jax.inference.openai_engine.OpenAISampler`): the judge asks an OpenAI-compatible server, or a
  pool of them (`inference.url`, comma-separated; `api_model`, `concurrency`, `prompts_per_request`, `timeout_s`,
  `retries`, `bench_after`, `bench_s`: `rrc_jax.inference.pool`; `prompt_format`, `extra_body` for servers that
  take text prompts only, such as `transformers serve`; a run stops when
  more than `max_failed_fraction` of a step's requests fail). It serves the `grm` role only
  (`ENGINE_ROLES`); the rollout and the reference's anchors stay on the JAX engine, which they need (the learner
  reads the rollout's log-probs, and the rollout follows the policy's every update).

A run's samplers come from `role_sampler(roles, role, inference)`, which loads the role's model only when the
engine runs it in this process (a judge served elsewhere never has its weights loaded in the trainer). Another
engine is one adapter and one line here. Callers never construct an engine themselves. The role is what a
sampler is built for: it names the sampler in errors and stats, and it is where a role's own inference layout
attaches (docs/design.md, section 2, "Samplers, one per role").
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import ClassVar

from rrc_jax.errors import ConfigError
from rrc_jax.inference.engine import JaxSampler
from rrc_jax.inference.openai_engine import PROMPT_FORMATS, OpenAISampler, check_urls
from rrc_jax.inference.sampler import Sampler
from rrc_jax.settings import at_least, field_error, one_of
from rrc_jax.sharding import ROLES

ENGINES: dict[str, Callable[..., Sampler]] = {"jax": JaxSampler, "openai": OpenAISampler}
ENGINE_ROLES: dict[str, tuple[str, ...]] = {"jax": ROLES, "openai": ("grm",)}  # the others: the JAX engine


@dataclasses.dataclass(frozen=True)
class InferenceConfig:
    """The inference engine of a run's samplers (`inference`; the module docstring): `engine`, and for `openai`
    the server (`url`; several, comma-separated, are a pool of one model's servers: `rrc_jax.inference.pool`),
    its served model name `api_model`, the requests in flight (`concurrency`), the most questions one request
    carries (`prompts_per_request`), each attempt's limit (`timeout_s`), the attempts after the first (`retries`,
    on another server of a pool where there is one), how many failed attempts in a row bench a server of a pool
    (`bench_after`) and for how long (`bench_s`), and the share of a step's requests that may fail before the run
    stops (`max_failed_fraction`; 1: never, `rrc_jax.rl.guard`); whether prompts go as token ids or text
    (`prompt_format`; "auto": the probe's choice) and a request's further fields (`extra_body`, a JSON object)."""

    GROUP: ClassVar[str] = "inference"
    engine: str = "jax"
    url: str = ""
    api_model: str = ""
    concurrency: int = 16
    prompts_per_request: int = 32
    timeout_s: float = 60.0
    retries: int = 2
    bench_after: int = 3
    bench_s: float = 30.0
    max_failed_fraction: float = 0.5
    prompt_format: str = "auto"  # "ids", "text" (servers that take strings only), "auto": the probe's choice
    extra_body: str = ""  # a JSON object added to every request (a server's own fields)

    def __post_init__(self):
        check_engine(self.engine)
        if self.engine == "openai":
            if not self.url:
                raise field_error("inference", "url", "empty; the openai engine asks a server: give its base URL, "
                                  "e.g. --config.inference.url=http://10.0.0.2:8000 (several: comma-separated)")
            urls = check_urls(self.url)
            if len(set(urls)) != len(urls):
                raise field_error("inference", "url", f"{self.url!r} lists a server twice")
        at_least("inference", "concurrency", self.concurrency, 1)
        at_least("inference", "prompts_per_request", self.prompts_per_request, 1)
        at_least("inference", "retries", self.retries, 0)
        at_least("inference", "bench_after", self.bench_after, 1)
        if not self.bench_s >= 0:
            raise field_error("inference", "bench_s", f"{self.bench_s} must be >= 0")
        if not self.timeout_s > 0:
            raise field_error("inference", "timeout_s", f"{self.timeout_s} must be > 0")
        one_of("inference", "prompt_format", self.prompt_format, PROMPT_FORMATS)
        self.body()
        if not 0 <= self.max_failed_fraction <= 1:
            raise field_error("inference", "max_failed_fraction", f"{self.max_failed_fraction} must be in [0, 1] (a "
                              "share of a step's requests; 1: never stop)")

    def body(self) -> dict:
        """`extra_body` as a dict; a one-line `ConfigError` unless it is a JSON object."""
        try:
            body = json.loads(self.extra_body) if self.extra_body else {}
        except ValueError as e:
            raise field_error("inference", "extra_body", f"{self.extra_body!r} is not JSON ({e})") from None
        if not isinstance(body, dict):
            raise field_error("inference", "extra_body", f"{self.extra_body!r} is not a JSON object of a "
                              "request's fields, e.g. {\"generation_config\": \"{\\\"do_sample\\\": true}\"} "
                              "(transformers serve)")
        return body

    def engine_for(self, role: str) -> str:
        """The engine that builds `role`'s sampler: `engine` where it serves the role, else `jax`."""
        return self.engine if role in ENGINE_ROLES[self.engine] else "jax"

    def options(self, role: str) -> dict:
        """The engine's own options for `role`'s sampler (the server's, for `openai`)."""
        if self.engine_for(role) != "openai":
            return {}
        return {"url": self.url, "api_model": self.api_model, "concurrency": self.concurrency,
                "prompts_per_request": self.prompts_per_request,
                "timeout_s": self.timeout_s, "retries": self.retries, "bench_after": self.bench_after,
                "bench_s": self.bench_s, "prompt_format": self.prompt_format, "extra_body": self.body()}


def check_engine(engine: str) -> None:
    """A one-line `ConfigError` for an engine name `ENGINES` does not know."""
    if engine not in ENGINES:
        raise ConfigError(f"config.inference.engine: {engine!r} is not an inference engine; known: "
                          f"{', '.join(ENGINES)}")


def make_sampler(role: str, model, tokenizer=None, *, engine: str | InferenceConfig | Mapping = "jax",
                 **options) -> Sampler:
    """The Sampler of `role` (one of `rrc_jax.sharding.ROLES`) on `model` and its `tokenizer` (the stop tokens,
    the pad id), built by the engine a run's `inference` group (`engine`: an `InferenceConfig`, the config group
    itself, or an engine's name) names for that role, with the caller's `options` (e.g. `max_batch`, the most rows
    per model call) and the engine's own (`InferenceConfig.options`)."""
    if role not in ROLES:
        raise ValueError(f"make_sampler: unknown role {role!r}; roles are {', '.join(ROLES)}")
    engine = _inference(engine)
    return ENGINES[engine.engine_for(role)](model, tokenizer, role=role, **options, **engine.options(role))


def role_sampler(roles, role: str, engine: str | InferenceConfig | Mapping = "jax", **options) -> Sampler:
    """`make_sampler` for `role` of a run's `roles` (`rrc_jax.rl.roles.Roles`), with its tokenizer: over the role's
    loaded model when the engine runs in this process; over its architecture alone (`Roles.config`: stop tokens,
    context length) when the engine's server holds the weights, which are then never loaded here, and the server
    is asked once whether it answers (`OpenAISampler.probe`: a one-line `ConfigError` if not)."""
    engine = _inference(engine)
    if engine.engine_for(role) == "jax":
        return make_sampler(role, roles.model(role), roles.tokenizer(role), engine=engine, **options)
    sampler = make_sampler(role, roles.config(role), roles.tokenizer(role), engine=engine, **options)
    sampler.probe()
    return sampler


def _inference(engine: str | InferenceConfig | Mapping) -> InferenceConfig:
    if isinstance(engine, str):
        return InferenceConfig(engine=engine)
    return engine if isinstance(engine, InferenceConfig) else InferenceConfig(**dict(engine))
