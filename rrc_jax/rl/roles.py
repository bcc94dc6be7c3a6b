"""The models of a run, by role (`policy`, `reference`, `grm`, `drm`), resolved and loaded on first use only.

A role names a Hugging Face directory or `toy` (`config.models.*`): a causal LM, or for the DRM also a
`LlamaForSequenceClassification` / `Qwen2ForSequenceClassification` reward model (a `score` head). The toy world is
built (or read from its cache) the first time a toy role is asked for. A run asks only for the roles it needs: an
AGR run on real checkpoints never resolves the DRM, so it never builds the toy world for it. `init_from` (another run's
checkpoints) sets the policy's parameters and, unless `models.reference` names its own directory, the reference's
too, so that the KL target, PRC's 'initial' references, AGR's anchors and the eval baseline are the policy a run
starts from.
"""

from __future__ import annotations

from pathlib import Path

from rrc_jax import distributed
from rrc_jax.errors import ConfigError
from rrc_jax.models import Decoder, load_hf, load_tokenizer
from rrc_jax.models.decoder import is_sequence_classifier
from rrc_jax.models.hf_io import read_hf_config
from rrc_jax.progress import say

ROLES = ("policy", "reference", "grm", "drm")
TOY_NAMES = ("policy", "grm", "drm", "pointwise")  # `toy:<name>`; the pointwise judge is built only when asked for


class Roles:
    """Lazily resolved and loaded models of a trainer config, each sharded over `mesh` by its logical axes (None:
    the default device); `loaded` lists the roles loaded so far."""

    def __init__(self, config, mesh=None):
        self.config, self.mesh = config, mesh
        self.loaded: list[str] = []
        self._models: dict[str, Decoder] = {}
        self._tokenizers: dict[str, object] = {}
        self._toy_paths: dict[str, Path] = {}

    def _name(self, role: str) -> str:
        m = self.config.models
        return {"policy": m.policy, "reference": m.reference or m.policy, "grm": m.grm, "drm": m.drm}[role]

    def _field(self, role: str) -> str:
        """The `config.models` field that names `role`'s model (the reference defaults to the policy's)."""
        return "policy" if role == "reference" and not self.config.models.reference else role

    def path(self, role: str) -> Path:
        """The Hugging Face directory of `role` (the toy world's, built on first use, for `toy`; `toy:<name>`
        names one of the toy models (`TOY_NAMES`) for any role, e.g. the toy GRM as the policy of RLVR, the toy
        pointwise judge as IRPO's)."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        name = self._name(role)
        if name == "toy" or name.startswith("toy:"):
            which = name.partition(":")[2] or ("policy" if role == "reference" else role)
            if which not in TOY_NAMES:
                raise ConfigError(f"config.models: {name!r}; the toy world's models are "
                                  f"{', '.join('toy:' + n for n in TOY_NAMES)}")
            path = self._toy(which)
        else:
            path = Path(name).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(f"config.models.{self._field(role)}: {path} is not a Hugging Face model directory (no "
                              "config.json); give a local checkpoint directory or 'toy'")
        return path

    def _toy(self, which: str) -> Path:
        """The directory of toy model `which`, built (or read from the cache) by process 0 while the others wait."""
        from rrc_jax.data.toy.world import ModelSpec, WorldSettings, build_pointwise, build_world

        toy = self.config.toy
        settings = WorldSettings.from_config(toy)
        if which not in self._toy_paths:
            if not distributed.is_main():  # process 0 builds (or reads) the cache; the others then read it
                distributed.barrier(f"toy {which}")
            if which == "pointwise":
                self._toy_paths[which] = build_pointwise(settings, ModelSpec.from_config(toy, which), toy.cache_dir)
            else:
                world = build_world(settings, toy.cache_dir)
                self._toy_paths.update(policy=world.policy, grm=world.grm, drm=world.drm)
            if distributed.is_main():
                distributed.barrier(f"toy {which}")
        return self._toy_paths[which]

    def tokenizer(self, role: str):
        if role not in self._tokenizers:
            self._tokenizers[role] = load_tokenizer(self.path(role))
        return self._tokenizers[role]

    def model(self, role: str) -> Decoder:
        """The model of `role`, loaded once (the DRM with its value head, a sequence classifier's `score.weight`;
        the policy and, by default, the reference from `init_from` when it is set). Every model computes in
        `models.dtype`; the frozen ones are stored in it too, the policy's parameters stay float32 (master weights)."""
        if role not in self._models:
            path, dtype = self.path(role), self.config.models.dtype
            if role != "drm" and is_sequence_classifier(read_hf_config(path)):
                raise ConfigError(f"config.models.{self._field(role)}: {path} is a sequence-classification reward "
                                  "model (a score head, no LM head); it can be config.models.drm only, give a "
                                  "causal LM here")
            model = load_hf(path, dtype=dtype, param_dtype="float32" if role == "policy" else dtype,
                            value_head=role == "drm" or None, mesh=self.mesh)
            if self._from_init(role):
                from rrc_jax.checkpoint import Checkpointer

                if "://" not in self.config.init_from and not Path(self.config.init_from).expanduser().is_dir():
                    raise ConfigError(f"config.init_from: {self.config.init_from} is not a directory; give another "
                                      "run's checkpoints directory (its workdir/checkpoints)")
                step = Checkpointer(self.config.init_from, create=False).restore_params(model)
                say(f"initialized the {role} from {self.config.init_from} (step {step})")
            self._models[role] = model
            self.loaded.append(role)
        return self._models[role]

    def _from_init(self, role: str) -> bool:
        c = self.config
        return bool(c.init_from) and (role == "policy" or (role == "reference" and not c.models.reference))
