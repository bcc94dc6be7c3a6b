"""Serve a local Hugging Face checkpoint (a judge) through an OpenAI-compatible `/v1/completions` endpoint.

    python -m rrc_jax.serve --model=DIR [--host=127.0.0.1 --port=8000 --served_name=NAME --max_batch=64
                                         --batch_wait_ms=5 --max_body_mb=16 --dtype=bfloat16 --mesh=auto]

A trainer then asks it with `--config.inference.engine=openai --config.inference.url=http://HOST:PORT`
(`rrc_jax.inference.openai_engine`), and so can any OpenAI client. Concurrent requests are batched into the engine
(`rrc_jax.inference.server`: what a request may hold, and what is and is not reproducible). One process serves:
the model is held over this host's devices in the inference layout. Needs the serve extra
(`pip install 'rrc-jax[serve]'`). Stops on Ctrl-C.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
from absl import flags

from rrc_jax import cli
from rrc_jax.errors import ConfigError
from rrc_jax.inference import make_sampler
from rrc_jax.models.decoder_config import KV_DTYPES
from rrc_jax.models.lora import WEIGHT_QTYPES
from rrc_jax.progress import say

_MODEL = cli.model_flags("the model to serve")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.")
_NAME = flags.DEFINE_string("served_name", "", "The model name requests may give (default: the directory's name).")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 64, "Most rows (prompts x n) of one engine call; a larger request runs "
                                  "as several, taking turns with the others.")
_WEIGHTS = flags.DEFINE_enum("weight_qtype", "", list(WEIGHT_QTYPES), "Store the frozen model's projections quantized "
                              "(qwix; the judge's reward.judge.weight_qtype): a byte a weight read per decode step.")
_KV = flags.DEFINE_enum("kv_dtype", "", list(KV_DTYPES), "Store the KV cache's keys and values in a byte (the "
                        "judge's reward.judge.kv_dtype); default: the compute dtype.")
_WAIT = flags.DEFINE_float("batch_wait_ms", 5.0, "How long a batch waits for more requests after its first.")
_MAX_BODY = flags.DEFINE_integer("max_body_mb", 16, "Largest request body in MiB; a larger one is a 413, read no "
                                 "further than this.")


def serve() -> None:
    """Check the flags, take the port, load the checkpoint and serve it until interrupted (a user's mistake raises
    `ConfigError`)."""
    cli.check_at_least(1, "max_batch", "max_body_mb")
    if not (math.isfinite(_WAIT.value) and _WAIT.value >= 0):
        raise cli.flag_error("batch_wait_ms", "must be a finite number >= 0")
    if not 1 <= _PORT.value <= 65535:
        raise cli.flag_error("port", "must be in 1-65535")
    from rrc_jax.inference.server import bind, make_app, uvicorn_server  # the serve extra (starlette, uvicorn)

    try:  # before the model loads: a busy port is said at once
        sock = bind(_HOST.value, _PORT.value)
    except OSError as e:
        raise ConfigError(f"--host={_HOST.value} --port={_PORT.value}: cannot listen there ({e.strerror or e}); "
                          "choose a free port, or stop what holds it") from None

    with sock:
        model, tokenizer, _ = cli.load_model(_MODEL.model.value, _MODEL.dtype.value, _MODEL.mesh.value,
                                             weight_qtype=_WEIGHTS.value, kv_dtype=_KV.value)
        if jax.process_count() > 1:
            raise ConfigError("rrc_jax.serve runs in one process; serve from one host (its devices hold the model)")
        name = _NAME.value or Path(_MODEL.model.value).name
        sampler = make_sampler("grm", model, tokenizer, max_batch=_MAX_BATCH.value, reuse_shapes=True)
        app = make_app(sampler, tokenizer, served_name=name, max_batch=_MAX_BATCH.value,
                       batch_wait_s=_WAIT.value / 1000, vocab_size=model.cfg.vocab_size,
                       max_body_bytes=_MAX_BODY.value << 20)
        say(f"serving {name} ({_MODEL.model.value}) on http://{_HOST.value}:{_PORT.value}/v1/completions")
        uvicorn_server(app).run(sockets=[sock])


def main(argv: list[str]) -> None:
    cli.no_arguments(argv)
    cli.exit_on_user_error(serve, also=(ValueError,))


if __name__ == "__main__":
    cli.start(main)
