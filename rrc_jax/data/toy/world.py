"""Build (once) and cache the toy world's models: a policy, a generative judge (GRM) and a DRM.

`build_world(settings, cache_dir)` trains, on first use:

- the **policy**: SFT on noisy demonstrations of the sorting task, so it starts mediocre and diverse;
- the **GRM**: SFT (Eq. 2) on judge questions about pairs of demonstrations, A/B order random, four in five with
  the `toy_pairwise_cot` template (imitating the toy judgment: sorted answer, the score of each response,
  verdict), one in five with its direct-verdict variant `toy_pairwise_direct` (the verdict alone), so that PRC
  without thinking has a judge trained for it;
- the **DRM**: the same backbone size with a scalar value head, Bradley-Terry (Eq. 1) on the same kind of pairs;

and saves each as a Hugging Face directory (safetensors + config.json + the character tokenizer) under
`cache_dir/<key>/`, where `key` hashes the settings. Later calls with the same settings reuse them.

`build_pointwise(settings, spec, cache_dir)` trains, on first use and in a directory of its own (only IRPO runs
need it), the toy **pointwise judge**: SFT on `toy_pointwise` judgments (the sorted answer, then the response's
score), IRPO's starting point.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import filelock
import jax
import numpy as np
from flax import nnx

from rrc_jax.config import TOY_MODELS
from rrc_jax.data.toy.task import ALPHABET, DIGITS, SortTask, oracle_quality, toy_judgment, toy_score_judgment
from rrc_jax.judge.prompts import direct_template, encode_text, get_template, render_parts
from rrc_jax.models import Decoder, DecoderConfig, load_hf, load_tokenizer, prompt_ids, save_hf
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.data.preferences import Preference
from rrc_jax.rm.examples import drm_batches, grm_example, sft_batches
from rrc_jax.rm.fit import fit
from rrc_jax.sharding import model_context

VERSION = 5  # bump when the world's recipe changes, so stale caches are not reused
JUDGE_TEMPLATE = get_template("toy_pairwise_cot")
DIRECT_TEMPLATE = direct_template(JUDGE_TEMPLATE)
DIRECT_SHARE = 0.2  # of the GRM's examples; 1500 steps keep 1200 steps' worth of reasoning examples
POINTWISE_TEMPLATE = get_template("toy_pointwise")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A tiny Llama-style model and how long to train it."""

    hidden: int = 64
    layers: int = 2
    steps: int = 600
    batch_size: int = 64
    learning_rate: float = 3e-3

    @classmethod
    def from_config(cls, toy, role: str) -> ModelSpec:
        """The spec of toy model `role` (`TOY_MODELS`) with the steps of a trainer config's `toy.<role>_steps`."""
        return cls(**{**TOY_MODELS[role], "steps": toy[f"{role}_steps"]})


@dataclasses.dataclass(frozen=True)
class WorldSettings:
    task: SortTask = SortTask()
    policy: ModelSpec = ModelSpec(**TOY_MODELS["policy"])
    grm: ModelSpec = ModelSpec(**TOY_MODELS["grm"])
    drm: ModelSpec = ModelSpec(**TOY_MODELS["drm"])
    seed: int = 0

    @classmethod
    def from_config(cls, toy) -> WorldSettings:
        """The settings of a trainer config's `toy` group (`rrc_jax.config.base_config`)."""
        spec = lambda role: ModelSpec.from_config(toy, role)
        return cls(task=SortTask(toy.min_len, toy.max_len, toy.noise), policy=spec("policy"), grm=spec("grm"),
                   drm=spec("drm"), seed=toy.seed)

    def key(self) -> str:
        blob = json.dumps({"version": VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class World:
    """Paths of the built models (Hugging Face directories, each with the tokenizer)."""

    root: Path
    policy: Path
    grm: Path
    drm: Path


def model_config(spec: ModelSpec, vocab_size: int, *, value_head: bool = False) -> DecoderConfig:
    return DecoderConfig(model_type="llama", vocab_size=vocab_size, hidden_size=spec.hidden,
                         intermediate_size=3 * spec.hidden, num_layers=spec.layers, num_heads=4, num_kv_heads=2,
                         head_dim=spec.hidden // 4, max_position_embeddings=256, tie_word_embeddings=True,
                         value_head=value_head, bos_token_id=1, eos_token_ids=(2,), pad_token_id=0)


def _response(task: SortTask, digits: str, rng: np.random.Generator) -> str:
    """A demonstration, padded with 1-3 stray digits one time in four, so that reward models learn that padding
    costs (an RL policy tries it soon enough)."""
    out = task.demonstration(digits, rng)
    if rng.random() < 0.25:
        out += "".join(rng.choice(list(DIGITS), int(rng.integers(1, 4))))
    return out


def _pair(task: SortTask, rng: np.random.Generator) -> tuple[str, str, str]:
    """A prompt and two distinct responses to it (possibly of equal quality)."""
    digits = task.prompt(rng)
    a = _response(task, digits, rng)
    b = _response(task, digits, rng)
    while b == a:
        b = _response(task, digits, rng)
    return digits, a, b


def toy_preferences(task: SortTask, n: int, rng: np.random.Generator, exclude: set[str] = frozenset(),
                    name: str = "toy") -> list[Preference]:
    """`n` preference pairs of the toy task whose responses differ in oracle quality (the better one chosen), on
    prompts whose text is not in `exclude`; `key` `f"{name}:{i}"`."""
    out: list[Preference] = []
    while len(out) < n:
        digits, a, b = _pair(task, rng)
        qa, qb = oracle_quality(digits, a), oracle_quality(digits, b)
        if qa != qb and task.prompt_text(digits) not in exclude:
            chosen, rejected = (a, b) if qa > qb else (b, a)
            out.append(Preference(task.prompt_text(digits), chosen, rejected, key=f"{name}:{len(out)}"))
    return out


def train_policy(settings: WorldSettings, tokenizer, rng) -> Decoder:
    task, spec = settings.task, settings.policy
    model = Decoder(model_config(spec, len(tokenizer)), rngs=nnx.Rngs(settings.seed))
    eos = int(tokenizer.eos_token_id)

    def example():
        digits = task.prompt(rng)
        return (prompt_ids(tokenizer, task.prompt_text(digits)),
                list(tokenizer(task.demonstration(digits, rng), add_special_tokens=False)["input_ids"]) + [eos])

    fit(model, sft_batches(example, spec.batch_size, 0), kind="sft", steps=spec.steps,
        learning_rate=spec.learning_rate, desc="toy policy (SFT)")
    return model


def grm_examples(task: SortTask, tokenizer, rng: np.random.Generator):
    """The GRM's SFT example factory: `() -> (question ids, judgment ids + EOS)` for a random pair, with the
    reasoning template (the toy judgment) or, one time in `DIRECT_SHARE`, its direct-verdict variant (the
    judgment's verdict alone)."""

    def example():
        digits, a, b = _pair(task, rng)
        chosen, rejected = (a, b) if oracle_quality(digits, a) >= oracle_quality(digits, b) else (b, a)
        pref = Preference(task.prompt_text(digits), chosen, rejected)
        direct = rng.random() < DIRECT_SHARE
        return grm_example(tokenizer, DIRECT_TEMPLATE if direct else JUDGE_TEMPLATE, pref, rng,
                           judgment=lambda x, y, _: toy_judgment(digits, x, y)[-5:] if direct
                           else toy_judgment(digits, x, y))

    return example


def train_grm(settings: WorldSettings, tokenizer, rng) -> Decoder:
    spec = settings.grm
    model = Decoder(model_config(spec, len(tokenizer)), rngs=nnx.Rngs(settings.seed + 1))
    fit(model, sft_batches(grm_examples(settings.task, tokenizer, rng), spec.batch_size, 0), kind="sft",
        steps=spec.steps, learning_rate=spec.learning_rate, desc="toy GRM (Eq. 2)")
    return model


def pointwise_examples(task: SortTask, tokenizer, rng: np.random.Generator):
    """The pointwise judge's SFT example factory: `() -> (question ids, judgment ids + EOS)` for one random
    response (a demonstration, possibly padded) rendered with `toy_pointwise`, the target its toy score judgment."""
    eos = int(tokenizer.eos_token_id)

    def example():
        digits = task.prompt(rng)
        response = _response(task, digits, rng)
        prefix, suffix = render_parts(tokenizer, POINTWISE_TEMPLATE, task.prompt_text(digits), response=response)
        return (encode_text(tokenizer, prefix + suffix, first=True),
                encode_text(tokenizer, toy_score_judgment(digits, response), first=False) + [eos])

    return example


def train_pointwise(task: SortTask, spec: ModelSpec, seed: int, tokenizer, rng) -> Decoder:
    model = Decoder(model_config(spec, len(tokenizer)), rngs=nnx.Rngs(seed + 3))
    fit(model, sft_batches(pointwise_examples(task, tokenizer, rng), spec.batch_size, 0), kind="sft",
        steps=spec.steps, learning_rate=spec.learning_rate, desc="toy pointwise judge (SFT)")
    return model


def train_drm(settings: WorldSettings, tokenizer, rng) -> Decoder:
    task, spec = settings.task, settings.drm
    model = Decoder(model_config(spec, len(tokenizer), value_head=True), rngs=nnx.Rngs(settings.seed + 2))

    def pref():
        while True:
            digits, a, b = _pair(task, rng)
            qa, qb = oracle_quality(digits, a), oracle_quality(digits, b)
            if qa != qb:
                return Preference(task.prompt_text(digits), *((a, b) if qa > qb else (b, a)))

    fit(model, drm_batches(tokenizer, pref, spec.batch_size, 0), kind="bt", steps=spec.steps,
        learning_rate=spec.learning_rate, desc="toy DRM (Eq. 1)")
    return model


def _build_once(root: Path, what: str, settings: dict, build: Callable[[Path], None]) -> None:
    """Run `build(root)` unless `root/world.json` says it ran: once per cache directory, even across processes
    (another process building the same `root` holds a file lock; this one waits, then reuses its result)."""
    marker = root / "world.json"
    if marker.is_file():
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(f"{root}.lock"):
        if marker.is_file():
            return
        root.mkdir(parents=True, exist_ok=True)
        print(f"building {what} in {root} (first use; cached afterwards)", file=sys.stderr)
        t0 = time.time()
        with jax.set_mesh(None), model_context(None):  # tiny models: trained on one device, whatever mesh is set
            build(root)
        marker.write_text(json.dumps({"version": VERSION, "settings": settings,
                                      "seconds": round(time.time() - t0, 1)}, indent=2) + "\n")


def build_world(settings: WorldSettings, cache_dir: str | Path) -> World:
    """The toy world's model directories, trained and cached on first use (progress on stderr)."""
    root = Path(cache_dir).expanduser() / f"toy-{settings.key()}"

    def build(root: Path) -> None:
        tokenizer, rng = make_char_tokenizer(ALPHABET), np.random.default_rng(settings.seed)
        for name, train in (("policy", train_policy), ("grm", train_grm), ("drm", train_drm)):
            save_hf(train(settings, tokenizer, rng), root / name, tokenizer=tokenizer)

    _build_once(root, "the toy world", dataclasses.asdict(settings), build)
    return World(root, root / "policy", root / "grm", root / "drm")


def build_pointwise(settings: WorldSettings, spec: ModelSpec, cache_dir: str | Path) -> Path:
    """The toy pointwise judge's Hugging Face directory for the world of `settings` (its task and seed), trained
    with `spec` and cached on first use."""
    blob = {"task": dataclasses.asdict(settings.task), "pointwise": dataclasses.asdict(spec), "seed": settings.seed}
    key = hashlib.sha256(json.dumps({"version": VERSION, **blob}, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir).expanduser() / f"toy-pointwise-{key}"

    def build(root: Path) -> None:
        tokenizer = make_char_tokenizer(ALPHABET)
        model = train_pointwise(settings.task, spec, settings.seed, tokenizer, np.random.default_rng(settings.seed))
        save_hf(model, root / "pointwise", tokenizer=tokenizer)

    _build_once(root, "the toy pointwise judge", blob, build)
    return root / "pointwise"


def load_world(world: World):
    """(policy, grm, drm, tokenizer) loaded from a built world."""
    return load_hf(world.policy), load_hf(world.grm), load_hf(world.drm), load_tokenizer(world.policy)
