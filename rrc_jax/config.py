"""The command line's config schemas: the GRPO trainer's (`base_config`), the reward-model trainer's
(`rm_config`), and start-up validation (`validate` -> `TrainerSettings`, `validate_rm` -> `RMSettings`): the only
module that reads a `ConfigDict`; everything below it receives the typed settings.

The trainer's groups are built from its components' typed settings (`rrc_jax.settings`: the dataclasses beside
the code that reads them hold the defaults, their comments and their checks); the config files in `configs/`
(installed as `rrc_jax.configs`) call these, and the command line overrides fields (`--config.reward.judge.votes=8
--config.rl.group_size=16`). Unknown keys are rejected by ml_collections (the configs are locked); `validate`
parses every component once and rejects inconsistent values with one `ConfigError` naming the field and the fix.
`--config=agr.py` (a bare name) resolves to the packaged `configs/` (`resolve_config_argv`).

Where a default departs from the papers, the field's comment says so (README "Defaults and the papers").
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import math
import runpy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections

from rrc_jax.checkpoint import CheckpointConfig
from rrc_jax.constructions import (CONSTRUCTIONS, Construction, JudgeSettings, check_reward, construction_class,
                                   reward_defaults)
from rrc_jax.constructions.served import served
from rrc_jax.data.prompts import DataConfig, PromptSource
from rrc_jax.data.toy.task import TOY_MODELS, ToyTaskConfig
from rrc_jax.data.toy.world import ToyBuildConfig, ToyWorldConfig
from rrc_jax.distributed import DistributedConfig
from rrc_jax.errors import ConfigError
from rrc_jax.inference.factory import InferenceConfig
from rrc_jax.inference.openai_engine import check_url
from rrc_jax.metrics import MetricsConfig
from rrc_jax.models.lora import LoraConfig
from rrc_jax.rl.alarms import AlarmConfig
from rrc_jax.rl.held_out import EvalConfig
from rrc_jax.rl.grpo import GRPOConfig
from rrc_jax.rl.guard import GuardConfig
from rrc_jax.rl.learner import LearnerConfig
from rrc_jax.rl.pipeline import PipelineConfig
from rrc_jax.rl.roles import ModelsConfig
from rrc_jax.rl.rollout import RolloutConfig
from rrc_jax.rl.samples import SamplesConfig
from rrc_jax.rm.recipes import PreferenceDataConfig, RMJudgeConfig, RMModelConfig, RMTrainConfig, ToyPairsConfig
from rrc_jax.settings import config_fields, defaults, flat_fields
from rrc_jax.sharding import REWARD_ROLES, MeshConfig
from rrc_jax.workdir import ResumeConfig

# The top-level configs/, installed as rrc_jax.configs: found, not imported (its recipes import this module).
CONFIG_DIR = Path(importlib.util.find_spec("rrc_jax.configs").origin).resolve().parent


def parse(cls, config: ml_collections.ConfigDict, path: str | None = None):
    """The `cls` settings of `config`'s group at `path` (dotted; default `cls.GROUP`; "" the config's top level),
    checked by `cls`."""
    group = config
    for key in filter(None, (cls.GROUP if path is None else path).split(".")):
        group = group[key]
    return cls(**{f.name: group[f.name] for f in config_fields(cls)})


def config_record(config: ml_collections.ConfigDict) -> dict:
    """A config as the JSON dict a run records (`config.json`, checkpoint manifests, the resume check, W&B)."""
    return json.loads(config.to_json_best_effort())

def base_config(kind: str = "agr") -> ml_collections.ConfigDict:
    """The GRPO trainer's defaults, rewards of `kind`: the toy world on a laptop CPU (under 10 minutes); point
    `models.*` and `data.*` at real checkpoints and datasets to scale up."""
    c = ml_collections.ConfigDict()
    c.workdir = f"workdir/{kind}"
    c.steps = 40
    c.seed = 0
    c.init_from = ""  # another run's checkpoint directory (workdir/checkpoints): the policy and the reference

    # The model of each role, its dtype (`rrc_jax.rl.roles.ModelsConfig`): Hugging Face directories, "toy", or
    # "real" (SmolLM2-135M-Instruct, built on first use: `rrc_jax.models.real_model`).
    c.models = ml_collections.ConfigDict(defaults(ModelsConfig))
    # LoRA on the policy (`rrc_jax.models.lora.LoraConfig`; rank 0, the default, is a full fine-tune): adapters on
    # a frozen base (int8 / nf4 with `weight_qtype`), the reference that base with the initial adapters.
    c.policy = ml_collections.ConfigDict(dict(lora=ml_collections.ConfigDict(defaults(LoraConfig))))

    # Prompts (`rrc_jax.data.prompts.DataConfig`): "toy", "chat" (the packaged chat set, `rrc_jax.data.chat`) or a
    # source with one prompt per row in `field`. With a preference `format` every preference becomes a judge
    # question in `reward.judge.template` whose correct verdict is known: the prompts of RLVR and IRPO, which train
    # the policy as a judge.
    c.data = ml_collections.ConfigDict(defaults(DataConfig))

    # The toy world (`rrc_jax.data.toy.world.ToyWorldConfig`): its task's prompts (`rrc_jax.data.toy.task.
    # ToyTaskConfig`), where its models are cached, their training steps and the imperfect annotator its GRM learns
    # from (`rrc_jax.data.toy.world.ToyBuildConfig`); `cache_dir` first, as config.json files have it.
    build = defaults(ToyBuildConfig)
    c.toy = ml_collections.ConfigDict(dict(cache_dir=build.pop("cache_dir"), **defaults(ToyTaskConfig), **build))

    # GRPO (`rl`): the rollout (`rrc_jax.rl.rollout.RolloutConfig`), the learner (`rrc_jax.rl.learner.LearnerConfig`),
    # the objective (`rrc_jax.rl.grpo.GRPOConfig`), the divergence guard (`rrc_jax.rl.guard.GuardConfig`) and how
    # far the rollout runs ahead (`rrc_jax.rl.pipeline.PipelineConfig`): each dataclass holds its fields' defaults,
    # comments and checks.
    c.rl = ml_collections.ConfigDict(defaults(RolloutConfig, LearnerConfig, GRPOConfig, GuardConfig, PipelineConfig))

    # The reward construction (`reward.kind`: a kind of `rrc_jax.constructions.CONSTRUCTIONS`, or MODULE:NAME, a
    # plug-in), how the GRM is asked (`reward.judge`, `JudgeSettings`) and each construction's own group
    # (`reward.<kind>`): the defaults and their comments live with each construction's `Settings`.
    c.reward = ml_collections.ConfigDict(dict(kind=kind, **reward_defaults()))

    c.checkpoint = ml_collections.ConfigDict(defaults(CheckpointConfig))  # `rrc_jax.checkpoint.CheckpointConfig`
    c.eval = ml_collections.ConfigDict(defaults(EvalConfig))  # `rrc_jax.rl.held_out.EvalConfig`
    # What a run shows (README "Reading a run"): sample dumps (`rrc_jax.rl.samples.SamplesConfig`), alarms and the
    # abstention stop (`rrc_jax.rl.alarms.AlarmConfig`), TensorBoard and W&B (`rrc_jax.metrics.MetricsConfig`).
    c.log = ml_collections.ConfigDict(defaults(SamplesConfig, AlarmConfig, MetricsConfig))
    # A rerun resumes from the workdir's latest checkpoint; a change to the config that alters the optimization is
    # refused (`config_changes`) unless `allow_changes` (`rrc_jax.workdir.ResumeConfig`).
    c.resume = ml_collections.ConfigDict(defaults(ResumeConfig))
    # The inference engine of the run's samplers (`rrc_jax.inference.factory`): `jax`, or `openai` for a judge served
    # elsewhere (`url`, ...; the rollout and the anchors stay on the JAX engine).
    c.inference = ml_collections.ConfigDict(defaults(InferenceConfig))
    c.mesh = ml_collections.ConfigDict(defaults(MeshConfig))  # `rrc_jax.sharding.MeshConfig`
    # Multi-host start-up (`rrc_jax.distributed.DistributedConfig`): automatic on Cloud TPU VMs; elsewhere give all
    # three, or set JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID. num_processes 0 = a single process.
    c.distributed = ml_collections.ConfigDict(defaults(DistributedConfig))
    c.lock()
    return c


def rm_config(kind: str) -> ml_collections.ConfigDict:
    """The reward-model trainer's defaults: `kind` 'grm' (SFT on rationale + verdict, Eq. 2) or 'drm'
    (Bradley-Terry, Eq. 1), on the toy world's preference pairs (`data.path='toy'`) or a preference dataset
    (`data.path` a file, folder or hub name in `data.format`, fine-tuning the Hugging Face model `model.init`)."""
    c = ml_collections.ConfigDict()
    c.kind = kind
    c.workdir = f"workdir/{kind}"
    c.seed = 0
    # The recipe's groups are the dataclasses of `rrc_jax.rm.recipes` (their comments say what each field does):
    # the preferences (`PreferenceDataConfig`), the toy world's pairs (`ToyPairsConfig`), the model
    # (`RMModelConfig`: the toy world's size for `kind`), what a GRM is trained to answer (`RMJudgeConfig`) and the
    # optimization (`RMTrainConfig`).
    spec = TOY_MODELS.get(kind, TOY_MODELS["grm"])
    c.data = ml_collections.ConfigDict(defaults(PreferenceDataConfig))
    c.toy = ml_collections.ConfigDict(defaults(ToyPairsConfig))
    c.model = ml_collections.ConfigDict(dict(defaults(RMModelConfig), hidden=spec["hidden"], layers=spec["layers"]))
    c.judge = ml_collections.ConfigDict(defaults(RMJudgeConfig))
    c.train = ml_collections.ConfigDict(dict(defaults(RMTrainConfig), steps=spec["steps"]))
    # As the GRPO trainer's: every step's metrics to workdir/metrics.jsonl, TensorBoard and, with `wandb`, W&B; Orbax
    # checkpoints every `save_every` steps (0 = only at the end) and at the last, the `keep` latest kept, resumed by
    # rerunning the same command.
    c.log = ml_collections.ConfigDict(defaults(MetricsConfig))
    c.checkpoint = ml_collections.ConfigDict(dict(defaults(CheckpointConfig), save_every=100))
    c.resume = ml_collections.ConfigDict(defaults(ResumeConfig))  # as the trainer's (`config_changes`)
    c.inference = ml_collections.ConfigDict(defaults(InferenceConfig))  # as the trainer's: the held-out judge's sampler
    c.mesh = ml_collections.ConfigDict(defaults(MeshConfig))
    c.distributed = ml_collections.ConfigDict(defaults(DistributedConfig))
    c.lock()
    return c


def _bad(field: str, msg: str):
    raise ConfigError(f"config.{field}: {msg}")


def check_finite(record: Mapping[str, Any]) -> None:
    """A `ConfigError` naming the first float field of a config's record (`config_record`) that is NaN or infinite
    (every comparison with NaN is false, so a range check alone lets it through)."""
    for key, value in flat_fields(record).items():
        if isinstance(value, float) and not math.isfinite(value):
            _bad(key, f"{value} is not a finite number")


@dataclasses.dataclass(frozen=True)
class TrainerSettings:
    """A trainer config's components, parsed and checked once (`validate`); the trainer hands each its piece, and
    the reward construction's hooks read the whole (`rrc_jax.constructions.Construction`)."""

    rollout: RolloutConfig
    learner: LearnerConfig
    grpo: GRPOConfig
    guard: GuardConfig
    mesh: MeshConfig
    prompts: PromptSource
    judge: JudgeSettings
    reward: type[Construction]  # the class of `reward.kind` (`rrc_jax.constructions`)
    reward_kind: str  # `reward.kind` as given: a registered kind or MODULE:NAME
    reward_service: str  # `reward.service_url`: a reward service judges (`rrc_jax.constructions.served`), or ""
    constructions: Mapping[str, Any]  # each construction's parsed `Settings`, by kind (`reward.<kind>`)
    eval: EvalConfig
    checkpoint: CheckpointConfig
    samples: SamplesConfig
    alarms: AlarmConfig
    metrics: MetricsConfig
    models: ModelsConfig
    inference: InferenceConfig
    toy: ToyWorldConfig
    distributed: DistributedConfig
    resume: ResumeConfig
    lora: LoraConfig
    pipeline: PipelineConfig = PipelineConfig()
    workdir: str = "workdir"
    steps: int = 0
    seed: int = 0
    init_from: str = ""
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the config as run (`config_record`)
    reward_service_wait_s: float = 60.0  # `reward.service_wait_s`: how long a run waits for its reward service

    @property
    def reward_settings(self):
        """The run's construction's own settings (`reward.<kind>`; None for a kind without a group)."""
        return self.constructions.get(self.reward.kind)

    @property
    def reward_roles(self) -> frozenset[str]:
        """The models the reward needs beyond the policy (`Construction.roles`)."""
        return self.reward.roles(self)


def validate(c: ml_collections.ConfigDict) -> TrainerSettings:
    """The components of a trainer config (each checked beside its fields), after the checks across them; a
    `ConfigError` names the first inconsistent field and how to fix it."""
    record = config_record(c)
    check_finite(record)
    if c.steps < 0:
        _bad("steps", f"{c.steps} must be >= 0")
    rollout, learner, toy_task = parse(RolloutConfig, c), parse(LearnerConfig, c), parse(ToyTaskConfig, c)
    if rollout.rows % learner.minibatch_size:
        _bad("rl.minibatch_size", f"{learner.minibatch_size} must divide prompts_per_step x group_size = "
                                  f"{rollout.rows}")
    reward = construction_class(c.reward.kind)  # every construction's own group is checked, the run's or not
    kinds = {**CONSTRUCTIONS, reward.kind: reward}
    service, wait_s = c.reward.get("service_url", ""), c.reward.get("service_wait_s", 60.0)
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not 0 <= wait_s < float("inf"):
        _bad("reward.service_wait_s", f"{wait_s!r} must be a finite number of seconds >= 0")
    if service:
        service, reward = check_url(service, "config.reward.service_url"), served(reward)
    constructions = {kind: parse(cls.Settings, c, f"reward.{kind}") for kind, cls in kinds.items()
                     if cls.Settings and kind in c.reward}
    settings = TrainerSettings(
        rollout, learner, parse(GRPOConfig, c), parse(GuardConfig, c), parse(MeshConfig, c),
        PromptSource(parse(DataConfig, c), toy_task, c.reward.judge.template, c.seed), parse(JudgeSettings, c),
        reward, c.reward.kind, service, constructions, parse(EvalConfig, c), parse(CheckpointConfig, c),
        parse(SamplesConfig, c), parse(AlarmConfig, c), parse(MetricsConfig, c), parse(ModelsConfig, c),
        parse(InferenceConfig, c), ToyWorldConfig(toy_task, parse(ToyBuildConfig, c)), parse(DistributedConfig, c),
        parse(ResumeConfig, c), parse(LoraConfig, c), pipeline=parse(PipelineConfig, c), workdir=c.workdir,
        steps=c.steps, seed=c.seed, init_from=c.init_from, record=record, reward_service_wait_s=float(wait_s))
    check_reward(settings)
    check_judge_devices(settings)
    return settings


def check_judge_devices(s: TrainerSettings) -> None:
    """`mesh.judge_devices` only for a run whose reward runs a model in this process (a GRM or a DRM the JAX
    engine runs, `REWARD_ROLES`): set aside for nothing, those devices would sit idle all run."""
    n = s.mesh.judge_devices
    if not n or any(s.inference.engine_for(role) == "jax" for role in s.reward_roles & set(REWARD_ROLES)):
        return
    if s.reward_service:
        why = "the reward service at reward.service_url judges"
    elif "grm" in s.reward_roles:
        why = f"inference.engine={s.inference.engine!r}: its server judges"
    else:
        why = f"reward.kind={s.reward_kind!r} loads no GRM or DRM"
    raise ConfigError(f"config.mesh.judge_devices={n}: no reward model runs in this trainer ({why}), so the devices "
                      "set aside for it would sit idle; set mesh.judge_devices=0")


@dataclasses.dataclass(frozen=True)
class RMSettings:
    """A reward-model recipe's config (`rm_config`), parsed and checked once (`validate_rm`): `kind` 'grm' (SFT,
    Eq. 2) or 'drm' (Bradley-Terry, Eq. 1), its groups (`rrc_jax.rm.recipes`) and the run's record."""

    kind: str
    data: PreferenceDataConfig
    toy: ToyPairsConfig
    model: RMModelConfig
    judge: RMJudgeConfig
    train: RMTrainConfig
    metrics: MetricsConfig
    checkpoint: CheckpointConfig
    resume: ResumeConfig
    inference: InferenceConfig
    mesh: MeshConfig
    distributed: DistributedConfig
    workdir: str = "workdir"
    seed: int = 0
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the config as run (`config_record`)


def validate_rm(c: ml_collections.ConfigDict) -> RMSettings:
    """The settings of a reward-model recipe (`rm_config`); a `ConfigError` names the first bad field and the fix."""
    record = config_record(c)
    check_finite(record)
    if c.kind not in ("grm", "drm"):
        _bad("kind", f"{c.kind!r}; use 'grm' (SFT on rationale + verdict) or 'drm' (Bradley-Terry)")
    return RMSettings(c.kind, parse(PreferenceDataConfig, c), parse(ToyPairsConfig, c), parse(RMModelConfig, c),
                      parse(RMJudgeConfig, c), parse(RMTrainConfig, c), parse(MetricsConfig, c),
                      parse(CheckpointConfig, c), parse(ResumeConfig, c), parse(InferenceConfig, c),
                      parse(MeshConfig, c), parse(DistributedConfig, c), workdir=c.workdir, seed=c.seed,
                      record=record)


def settings_of(c: ml_collections.ConfigDict) -> TrainerSettings | RMSettings:
    """The validated settings of any config file's config: a GRPO trainer's (`base_config`, which RLVR's and IRPO's
    recipes are: `validate`) or a reward-model recipe's (`rm_config`: `validate_rm`)."""
    return validate(c) if "rl" in c else validate_rm(c)


def resolve_config_file(value: str) -> str:
    """`--config` as given when it names a file, else the packaged config of that name: `agr.py`, `agr` and
    `configs/agr.py` all find `configs/agr.py` (installed as `rrc_jax.configs`) from any directory. A `:argument`
    suffix is kept."""
    path, sep, arg = value.partition(":")
    if Path(path).expanduser().is_file():
        return value
    name = Path(path).name if Path(path).suffix == ".py" else f"{Path(path).name}.py"
    packaged = CONFIG_DIR / name
    if not packaged.is_file():
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.py") if not p.stem.startswith("_")))
        raise ConfigError(f"--config={value}: no such file, and no packaged config {name!r} (packaged: {known})")
    return str(packaged) + sep + arg


def resolve_config_argv(argv: list[str]) -> list[str]:
    """`argv` with its `--config=NAME` (or `--config NAME`) resolved by `resolve_config_file`."""
    out, i = list(argv), 0
    while i < len(out):
        if out[i].startswith("--config="):
            out[i] = "--config=" + resolve_config_file(out[i][len("--config="):])
        elif out[i] == "--config" and i + 1 < len(out):
            out[i + 1] = resolve_config_file(out[i + 1])
            i += 1
        i += 1
    return out


def load_config_file(value: str) -> ml_collections.ConfigDict:
    """The config of `--config=FILE[:ARG]` (`get_config(ARG)`); a `ConfigError` naming the file when it does not
    load."""
    path, _, arg = value.partition(":")
    try:
        get_config = runpy.run_path(path)["get_config"]
        return get_config(arg) if arg else get_config()
    except KeyError:
        raise ConfigError(f"--config={value}: the file defines no get_config()") from None
    except Exception as e:  # a config file is the user's code: any failure is theirs to fix
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) else ""
        raise ConfigError(f"--config={value} does not load{where}: {type(e).__name__}: {e}") from None


def _overrides(argv: list[str]) -> list[tuple[str, str]]:
    """`(key, value)` of every `--config.KEY=VALUE` (or `--config.KEY VALUE`) in `argv`."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--config."):
            key, sep, value = arg[len("--config."):].partition("=")
            if not sep and i + 1 < len(argv):
                value, i = argv[i + 1], i + 1
            out.append((key, value))
        i += 1
    return out


def _parses_as(value: str, like) -> bool:
    """Whether the command-line text `value` is a valid value for a field whose default is `like`."""
    if isinstance(like, bool):
        return value.lower() in ("true", "false", "1", "0")
    if isinstance(like, (int, float)):
        try:
            (float if isinstance(like, float) else int)(value)
        except ValueError:
            return False
    return True


def check_config_argv(argv: list[str]) -> None:
    """A `ConfigError` naming the first problem of a command line's config before anything runs: a `--config` file
    that does not load, an override without a `--config` to override, an unknown `--config.KEY` (with the nearest
    valid key) or a value of the wrong type."""
    files = [a[len("--config="):] for a in argv if a.startswith("--config=")]
    files += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"]
    if not files:
        if _overrides(argv):
            key, value = _overrides(argv)[0]
            raise ConfigError(f"--config.{key}={value}: overrides a config, and no --config is given; name one "
                              "first (--config=agr.py, a packaged recipe, or a file)")
        return
    leaves = flat_fields(config_record(load_config_file(files[-1])))
    for key, value in _overrides(argv):
        if key not in leaves:
            raise ConfigError(f"--config.{key}: no such field; {_nearest(key, leaves)}")
        if not _parses_as(value, leaves[key]):
            raise ConfigError(f"--config.{key}={value}: not {_a(type(leaves[key]).__name__)} (default "
                              f"{leaves[key]!r})")


def _nearest(key: str, leaves) -> str:
    """A hint for an unknown config key: the field of the same name elsewhere, else the nearest spelling, else the
    fields of its group."""
    group, _, name = key.rpartition(".")
    siblings = sorted({k[len(group) + 1:].split(".")[0] for k in leaves if k.startswith(f"{group}.")} if group
                      else {k.split(".")[0] for k in leaves})
    near = [k for k in leaves if k.split(".")[-1] == name]
    near = near or [f"{group}.{n}" if group else n for n in difflib.get_close_matches(name, siblings, n=1)]
    near = near or ([] if siblings else difflib.get_close_matches(key, leaves, n=1, cutoff=0.6))
    if near:
        return f"did you mean --config.{near[0]}?"
    return f"config.{group} has {', '.join(siblings)}" if group else f"the fields are {', '.join(siblings)}"


def _a(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"
