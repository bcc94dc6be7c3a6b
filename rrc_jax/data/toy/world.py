"""Build (once) and cache the toy world's models: a policy, a generative judge (GRM) and a DRM.

A trainer config's `toy` group parses into a `ToyWorldConfig`: the task's prompts (`task.ToyTaskConfig`) and how
the models are built (`ToyBuildConfig`: the cache, each model's training steps, the annotator); its `settings()`
are the `WorldSettings` that `build_world(settings, cache_dir)` trains, on first use:

- the **policy**: SFT on noisy demonstrations of the sorting task, so it starts mediocre and diverse;
- the **GRM**: SFT (Eq. 2) on an imperfect annotator's judgments (`task.Annotator`: miscounts, position bias on
  close calls, credit for padding) of pairs of demonstrations, four in five with the `toy_pairwise_cot` template
  (sorted answer, the written score of each response, verdict), one in five with its direct-verdict variant
  `toy_pairwise_direct` (the verdict alone), so that PRC without thinking has a judge trained for it;
- the **DRM**: the GRM's backbone size with a scalar value head, Bradley-Terry (Eq. 1) on the *same* pairs with the
  annotator's verdicts as labels (the paper's matched setting);

and saves each as a Hugging Face directory (safetensors + config.json + the character tokenizer) under
`cache_dir/<key>/`, where `key` hashes the settings. Later calls with the same settings reuse them. Every prompt
they train on is of the training split (`task.is_held_out` is False): evaluation prompts are never seen.

The default world ships with the package (`rrc_jax/data/toy/built/toy-<key>/`, 3 MB: `package_world` wrote it):
building it takes 10 minutes on 2 CPU cores, most of a first run's time. A world whose settings match a packaged
one is copied from there into the cache instead of trained, after every file's SHA-256 is checked against the
packaged `world.json` (a mismatch is an error: the package is damaged). The packaged world is what `build_world`
trains (`tests/test_toy_world.py` rebuilds it and compares the weights, a slow test); `packaged=False` always
trains.

`build_pointwise(settings, spec, cache_dir)` trains, on first use and in a directory of its own (only IRPO runs
need it), the toy **pointwise judge**: SFT on `toy_pointwise` judgments (the sorted answer, then the response's
score), IRPO's starting point.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import filelock
import jax
import numpy as np
from flax import nnx

from rrc_jax.data.preferences import Preference
from rrc_jax.data.toy.task import (
    ALPHABET,
    TOY_ANNOTATOR,
    TOY_MODELS,
    Annotator,
    SortTask,
    ToyTaskConfig,
    sample_pair,
    sample_response,
    toy_score_judgment,
)
from rrc_jax.errors import ConfigError
from rrc_jax.judge.templates import direct_template, encode_text, get_template, render_parts
from rrc_jax.judge.verdicts import parse_verdict
from rrc_jax.models import Decoder, DecoderConfig, load_hf, load_tokenizer, prompt_ids, save_hf
from rrc_jax.models.char_tokenizer import make_char_tokenizer
from rrc_jax.rm.examples import drm_batches, sft_batches
from rrc_jax.rm.fit import fit
from rrc_jax.settings import at_least, field_error
from rrc_jax.sharding import model_context

VERSION = 6  # bump when the world's recipe changes, so stale caches are not reused
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


@dataclasses.dataclass(frozen=True)
class WorldSettings:
    """What a toy world is trained from (its cache key, `key`): the task, each model's spec, the GRM's annotator."""

    task: SortTask = SortTask()
    policy: ModelSpec = ModelSpec(**TOY_MODELS["policy"])
    grm: ModelSpec = ModelSpec(**TOY_MODELS["grm"])
    drm: ModelSpec = ModelSpec(**TOY_MODELS["drm"])
    annotator: Annotator = Annotator(**TOY_ANNOTATOR)
    seed: int = 0

    def key(self) -> str:
        blob = json.dumps({"version": VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class ToyBuildConfig:
    """How the toy world's models are built (`toy`, beside the task's `ToyTaskConfig` fields): the directory they
    are cached in (keyed by their settings), each model's training steps (`TOY_MODELS`' sizes) and the imperfect
    annotator the GRM learns from (`task.Annotator`, `TOY_ANNOTATOR`)."""

    GROUP: ClassVar[str] = "toy"
    cache_dir: str = "~/.cache/rrc_jax"
    policy_steps: int = TOY_MODELS["policy"]["steps"]
    grm_steps: int = TOY_MODELS["grm"]["steps"]
    drm_steps: int = TOY_MODELS["drm"]["steps"]
    pointwise_steps: int = TOY_MODELS["pointwise"]["steps"]  # IRPO's starting point, built only for it
    miscount: float = TOY_ANNOTATOR["miscount"]
    position_bias: float = TOY_ANNOTATOR["position_bias"]
    length_bias: float = TOY_ANNOTATOR["length_bias"]

    def __post_init__(self):
        if not self.cache_dir:
            raise field_error("toy", "cache_dir", "empty; give a directory for the toy world's models")
        for role in TOY_MODELS:
            at_least("toy", f"{role}_steps", getattr(self, f"{role}_steps"), 0)
        for name in TOY_ANNOTATOR:
            if not 0 <= getattr(self, name) <= 1:
                raise field_error("toy", name, f"{getattr(self, name)} must be in [0, 1] (a probability)")

    def spec(self, role: str) -> ModelSpec:
        """The spec of toy model `role` (`TOY_MODELS`) trained for `<role>_steps`."""
        return ModelSpec(**{**TOY_MODELS[role], "steps": getattr(self, f"{role}_steps")})


@dataclasses.dataclass(frozen=True)
class ToyWorldConfig:
    """A trainer config's `toy` group as the toy world reads it: the task's prompts and seed, how its models are
    built."""

    task: ToyTaskConfig = ToyTaskConfig()
    build: ToyBuildConfig = ToyBuildConfig()

    def settings(self) -> WorldSettings:
        """The world `build_world` trains (and keys its cache by)."""
        b = self.build
        return WorldSettings(task=self.task.task, policy=b.spec("policy"), grm=b.spec("grm"), drm=b.spec("drm"),
                             annotator=Annotator(b.miscount, b.position_bias, b.length_bias), seed=self.task.seed)


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


def _question_ids(tokenizer, template, digits: str, **items: str) -> list[int]:
    """The ids of a toy judge question about the prompt `digits` (`template` rendered as the judge renders it)."""
    prefix, suffix = render_parts(tokenizer, template, SortTask.prompt_text(digits), **items)
    return encode_text(tokenizer, prefix + suffix, first=True)


def _target_ids(tokenizer, text: str) -> list[int]:
    return encode_text(tokenizer, text, first=False) + [int(tokenizer.eos_token_id)]


def train_policy(settings: WorldSettings, tokenizer) -> Decoder:
    task, spec = settings.task, settings.policy
    model = Decoder(model_config(spec, len(tokenizer)), rngs=nnx.Rngs(settings.seed))
    rng = np.random.default_rng([settings.seed, 0])

    def example():
        digits = task.prompt(rng)
        return prompt_ids(tokenizer, task.prompt_text(digits)), _target_ids(tokenizer, task.demonstration(digits, rng))

    fit(model, sft_batches(example, spec.batch_size, 0), objective="sft", steps=spec.steps,
        learning_rate=spec.learning_rate, desc="toy policy (SFT)")
    return model


def annotated_pairs(settings: WorldSettings) -> Iterator[tuple[str, str, str, str]]:
    """The endless stream `(digits, a, b, judgment)` that the GRM and the DRM both learn from, the same for the same
    settings: a training-split pair of responses shown as A and B, and the annotator's judgment of it."""
    rng = np.random.default_rng([settings.seed, 1])
    while True:
        digits, a, b = sample_pair(settings.task, rng)
        yield digits, a, b, settings.annotator.judgment(digits, a, b, rng)


def grm_examples(settings: WorldSettings, tokenizer):
    """The GRM's SFT example factory: `() -> (question ids, judgment ids + EOS)`, the next annotated pair with the
    reasoning template (the annotator's judgment) or, one time in `DIRECT_SHARE`, its direct-verdict variant (the
    judgment's verdict alone)."""
    pairs = annotated_pairs(settings)
    rng = np.random.default_rng([settings.seed, 2])  # which examples use the direct template

    def example():
        digits, a, b, judgment = next(pairs)
        direct = rng.random() < DIRECT_SHARE
        return (_question_ids(tokenizer, DIRECT_TEMPLATE if direct else JUDGE_TEMPLATE, digits, a=a, b=b),
                _target_ids(tokenizer, judgment[-5:] if direct else judgment))

    return example


def train_grm(settings: WorldSettings, tokenizer) -> Decoder:
    spec = settings.grm
    model = Decoder(model_config(spec, len(tokenizer)), rngs=nnx.Rngs(settings.seed + 1))
    fit(model, sft_batches(grm_examples(settings, tokenizer), spec.batch_size, 0), objective="sft",
        steps=spec.steps, learning_rate=spec.learning_rate, desc="toy GRM (Eq. 2)")
    return model


def train_drm(settings: WorldSettings, tokenizer) -> Decoder:
    """Bradley-Terry on the GRM's pairs (`annotated_pairs`), the annotator's verdict choosing the preferred one."""
    spec = settings.drm
    model = Decoder(model_config(spec, len(tokenizer), value_head=True), rngs=nnx.Rngs(settings.seed + 2))
    pairs = annotated_pairs(settings)

    def pref():
        digits, a, b, judgment = next(pairs)
        return Preference(SortTask.prompt_text(digits), *((a, b) if parse_verdict(judgment) == "A" else (b, a)))

    fit(model, drm_batches(tokenizer, pref, spec.batch_size, 0), objective="bt", steps=spec.steps,
        learning_rate=spec.learning_rate, desc="toy DRM (Eq. 1)")
    return model


def pointwise_examples(task: SortTask, tokenizer, rng: np.random.Generator):
    """The pointwise judge's SFT example factory: `() -> (question ids, judgment ids + EOS)` for one random
    response (a demonstration, possibly padded) rendered with `toy_pointwise`, the target its toy score judgment."""

    def example():
        digits = task.prompt(rng)
        response = sample_response(task, digits, rng)
        return (_question_ids(tokenizer, POINTWISE_TEMPLATE, digits, response=response),
                _target_ids(tokenizer, toy_score_judgment(digits, response)))

    return example


def train_pointwise(task: SortTask, spec: ModelSpec, seed: int, tokenizer) -> Decoder:
    model = Decoder(model_config(spec, len(tokenizer)), rngs=nnx.Rngs(seed + 3))
    rng = np.random.default_rng([seed, 3])
    fit(model, sft_batches(pointwise_examples(task, tokenizer, rng), spec.batch_size, 0), objective="sft",
        steps=spec.steps, learning_rate=spec.learning_rate, desc="toy pointwise judge (SFT)")
    return model


def _build_once(root: Path, what: str, settings: dict, build: Callable[[Path], None]) -> None:
    """Run `build(root)` unless `root/world.json` says it ran (saying `what` it does, e.g. "building the toy world"):
    once per cache directory, even across processes
    (another process building the same `root` holds a file lock; this one waits, then reuses its result)."""
    marker = root / "world.json"
    if marker.is_file():
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(f"{root}.lock"):
        if marker.is_file():
            return
        root.mkdir(parents=True, exist_ok=True)
        print(f"{what} into {root} (first use; cached afterwards)", file=sys.stderr)
        t0 = time.time()
        with jax.set_mesh(None), model_context(None):  # tiny models: trained on one device, whatever mesh is set
            build(root)
        marker.write_text(json.dumps({"version": VERSION, "settings": settings,
                                      "seconds": round(time.time() - t0, 1)}, indent=2) + "\n")


PACKAGED = Path(__file__).resolve().parent / "built"  # the packaged worlds (module docstring)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(root: Path) -> dict[str, str]:
    """SHA-256 of every file under `root` but its `world.json`, by path relative to it."""
    return {str(p.relative_to(root)): _sha256(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "world.json"}


def packaged_world(settings: WorldSettings) -> Path | None:
    """The packaged world of `settings`, checked file by file against its `world.json`; None when none ships."""
    root = PACKAGED / f"toy-{settings.key()}"
    if not (root / "world.json").is_file():
        return None
    expected = json.loads((root / "world.json").read_text()).get("files", {})
    found = _files(root)
    if not expected or found != expected:
        bad = sorted(k for k in set(found) | set(expected) if found.get(k) != expected.get(k))
        raise ConfigError(f"the packaged toy world {root} is damaged ({', '.join(bad[:3]) or 'no file list'} "
                           "differ from its world.json); reinstall rrc-jax")
    return root


def package_world(settings: WorldSettings, cache_dir: str | Path) -> Path:
    """Copy the built world of `settings` (trained if needed, never taken from the package) into the package,
    with each file's SHA-256 in its `world.json`; returns the packaged directory. Run after a change to the
    world's recipe (`VERSION`): `python -c "from rrc_jax.data.toy.world import *;
    package_world(WorldSettings(), '/tmp/fresh_world')"`."""
    world = build_world(settings, cache_dir, packaged=False)
    dest = PACKAGED / world.root.name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(world.root, dest)
    marker = json.loads((dest / "world.json").read_text())
    marker.pop("seconds", None)  # of one build on one machine
    marker["files"] = _files(dest)
    (dest / "world.json").write_text(json.dumps(marker, indent=2) + "\n")
    return dest


def build_world(settings: WorldSettings, cache_dir: str | Path, packaged: bool = True) -> World:
    """The toy world's model directories, trained (or, with `packaged`, copied from the package when it ships
    this world) and cached on first use (progress on stderr)."""
    root = Path(cache_dir).expanduser() / f"toy-{settings.key()}"
    shipped = packaged_world(settings) if packaged else None

    def build(root: Path) -> None:
        if shipped is not None:
            for name in ("policy", "grm", "drm"):
                shutil.copytree(shipped / name, root / name, dirs_exist_ok=True)
            return
        tokenizer = make_char_tokenizer(ALPHABET)
        for name, train in (("policy", train_policy), ("grm", train_grm), ("drm", train_drm)):
            save_hf(train(settings, tokenizer), root / name, tokenizer=tokenizer)

    what = f"copying the packaged toy world (SHA-256 checked) from {shipped}" if shipped else "building the toy world"
    _build_once(root, what, dataclasses.asdict(settings), build)
    return World(root, root / "policy", root / "grm", root / "drm")


def build_pointwise(settings: WorldSettings, spec: ModelSpec, cache_dir: str | Path) -> Path:
    """The toy pointwise judge's Hugging Face directory for the world of `settings` (its task and seed), trained
    with `spec` and cached on first use."""
    blob = {"task": dataclasses.asdict(settings.task), "pointwise": dataclasses.asdict(spec), "seed": settings.seed}
    key = hashlib.sha256(json.dumps({"version": VERSION, **blob}, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir).expanduser() / f"toy-pointwise-{key}"

    def build(root: Path) -> None:
        tokenizer = make_char_tokenizer(ALPHABET)
        model = train_pointwise(settings.task, spec, settings.seed, tokenizer)
        save_hf(model, root / "pointwise", tokenizer=tokenizer)

    _build_once(root, "building the toy pointwise judge", blob, build)
    return root / "pointwise"


def load_world(world: World):
    """(policy, grm, drm, tokenizer) loaded from a built world."""
    return load_hf(world.policy), load_hf(world.grm), load_hf(world.drm), load_tokenizer(world.policy)
