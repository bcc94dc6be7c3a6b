"""Checkpoint integrity on a tiny learner, without the toy world or a trainer: a truncated file
or 256 overwritten bytes in the latest checkpoint are detected, the step is set aside under `bad/` with one line and
the previous one resumed bit-identically; non-finite saved parameters are set aside likewise; rotation keeps the
last good checkpoint until newer finite ones exist; a clean round trip is bit-identical with its manifest; a fault on
every step, or a checkpoint of another model, is a one-line `ConfigError` with nothing moved."""

import glob
import itertools
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rrc_jax.checkpoint import Checkpointer, Replay
from rrc_jax.config import base_config, config_record
from rrc_jax.workdir import config_hash
from rrc_jax.errors import ConfigError
from rrc_jax.models import Decoder, DecoderConfig
from rrc_jax.rl.grpo import grpo_objective
from rrc_jax.rl.learner import Learner, make_optimizer
from rrc_jax.sharding import model_context


def tiny_learner(seed=0, hidden=16) -> Learner:
    cfg = DecoderConfig(model_type="llama", vocab_size=32, hidden_size=hidden, intermediate_size=32, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=8, max_position_embeddings=128, bos_token_id=1,
                        eos_token_ids=(2,), pad_token_id=0)
    with model_context(None):
        model = Decoder(cfg, rngs=nnx.Rngs(seed))
    return Learner(model, make_optimizer(1e-3), grpo_objective())


def host_state(learner: Learner) -> dict:
    return jax.tree.map(np.asarray, learner.state())


def identical(a: dict, b: dict) -> bool:
    """Bit-identical pytrees (same structure, dtypes and bytes; NaN equal to NaN)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(la, lb))


def advance(learner: Learner, value: float | None = None) -> None:
    """A stand-in for an update: every float array moves by 0.01 (or is set to `value`)."""
    shift = lambda x: (x + 0.01 if value is None else jnp.full_like(x, value)) if x.dtype == np.float32 else x + 1
    learner.load_state(jax.tree.map(shift, learner.state()))


def save_steps(ckpt: Checkpointer, learner: Learner, data: Replay, steps, value=None) -> dict:
    """Save each of `steps` after one stand-in update and one data item; returns each step's host state."""
    states = {}
    for step in steps:
        advance(learner, value)
        next(data)
        states[step] = host_state(learner)
        ckpt.maybe_save(step, learner, data, force=True)
    ckpt.wait()
    return states


def data_file(directory, step) -> str:
    """The largest array data file of `step`'s state."""
    files = [f for f in glob.glob(f"{directory}/{step}/state/**/d/*", recursive=True) if os.path.isfile(f)]
    return max(files, key=os.path.getsize)


def fresh_resume(directory, keep=2, seed=7):
    """A new process's view: a fresh learner and data iterator resumed from `directory`."""
    learner, data = tiny_learner(seed), Replay(itertools.count())
    ckpt = Checkpointer(directory, keep=keep)
    return ckpt, learner, data, ckpt.resume(learner, data)


def steps_on_disk(directory) -> list[int]:
    return sorted(int(p) for p in os.listdir(directory) if p.isdigit())


def test_a_truncated_latest_checkpoint_resumes_from_the_previous_one(tmp_path, capsys):
    directory = tmp_path / "checkpoints"
    ckpt = Checkpointer(directory, keep=3)
    states = save_steps(ckpt, tiny_learner(), Replay(itertools.count()), (1, 2, 3))
    ckpt.close()
    victim = data_file(directory, 3)
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)

    ckpt, learner, data, step = fresh_resume(directory, keep=3)
    ckpt.close()
    assert step == 2 and identical(host_state(learner), states[2]) and next(data) == 2
    assert steps_on_disk(directory) == [1, 2] and (directory / "bad" / "3" / "state").is_dir()
    err = capsys.readouterr().err
    assert "set aside the checkpoint of step 3" in err and "does not restore" in err
    assert "resumed from the checkpoint of step 2" in err


def test_a_bit_flipped_checkpoint_is_set_aside_and_the_good_one_survives_rotation(tmp_path, capsys):
    directory = tmp_path / "checkpoints"
    ckpt = Checkpointer(directory, keep=2)
    states = save_steps(ckpt, tiny_learner(), Replay(itertools.count()), (1, 2, 3))
    ckpt.close()
    assert steps_on_disk(directory) == [2, 3]
    victim = data_file(directory, 3)
    with open(victim, "r+b") as f:  # 256 bytes overwritten mid-file: restores as other (finite) values
        f.seek(os.path.getsize(victim) // 2 - 128)
        f.write(np.random.default_rng(0).integers(0, 256, 256, dtype=np.uint8).tobytes())

    ckpt, learner, data, step = fresh_resume(directory, keep=2)
    assert step == 2 and identical(host_state(learner), states[2])
    assert "set aside the checkpoint of step 3" in capsys.readouterr().err
    assert (directory / "bad" / "3").is_dir()
    # a finite step 3, then a diverged (NaN) step 4: step 2 stays, since only one newer finite checkpoint exists
    save_steps(ckpt, learner, data, (3,))
    save_steps(ckpt, learner, data, (4,), value=np.nan)
    assert steps_on_disk(directory) == [2, 3, 4]
    assert "step 4 holds non-finite values" in capsys.readouterr().err
    save_steps(ckpt, learner, data, (5,), value=0.5)  # two newer finite ones (3, 5): now step 2 goes
    assert steps_on_disk(directory) == [3, 4, 5]
    ckpt.close()


def test_non_finite_parameters_are_set_aside_and_a_state_from_another_step_mismatches(tmp_path, capsys):
    directory = tmp_path / "checkpoints"
    ckpt = Checkpointer(directory, keep=4)
    learner, data = tiny_learner(), Replay(itertools.count())
    states = save_steps(ckpt, learner, data, (1, 2))
    save_steps(ckpt, learner, data, (3,), value=np.inf)
    ckpt.close()
    shutil.rmtree(directory / "2" / "state")  # step 2's arrays replaced by step 1's: finite, but not its manifest's
    shutil.copytree(directory / "1" / "state", directory / "2" / "state")

    ckpt, learner, data, step = fresh_resume(directory, keep=4)
    ckpt.close()
    assert step == 1 and identical(host_state(learner), states[1]) and next(data) == 1
    err = capsys.readouterr().err
    assert "step 3" in err and "non-finite values in " in err
    assert "step 2" in err and "checksum mismatch against its manifest" in err
    assert sorted(os.listdir(directory / "bad")) == ["2", "3"] and steps_on_disk(directory) == [1]


def test_a_clean_round_trip_is_bit_identical_with_its_manifest(tmp_path):
    directory = tmp_path / "checkpoints"
    config = base_config("agr")
    record = config_record(config)
    ckpt = Checkpointer(directory, keep=2, record=record, config_hash=config_hash(record))
    learner, data = tiny_learner(), Replay(itertools.count())
    for _ in range(4):
        next(data)
    advance(learner)
    saved = host_state(learner)
    assert ckpt.maybe_save(5, learner, data, force=True)
    ckpt.close()
    manifest = Checkpointer(directory).manifest(5)
    assert manifest["step"] == 5 and manifest["config_hash"] == config_hash(record)
    assert manifest["config"]["rl"]["learning_rate"] == config.rl.learning_rate
    assert Checkpointer(directory).trained_config() == manifest["config"]
    assert manifest["arrays"]["params/embed"]["shape"] == [32, 16] and manifest["arrays"]["params/embed"]["finite"]
    assert len(manifest["arrays"]) == len(jax.tree.leaves(saved)) + 1  # and the step

    for restore in ("resume", "restore"):
        learner, data = tiny_learner(seed=3), Replay(itertools.count())
        ckpt = Checkpointer(directory, keep=2)
        assert getattr(ckpt, restore)(learner, data) == 5
        assert identical(host_state(learner), saved) and next(data) == 4
        ckpt.close()
    assert not (directory / "bad").exists()


def test_no_usable_step_or_another_model_is_one_config_error_and_nothing_moves(tmp_path):
    directory = tmp_path / "checkpoints"
    ckpt = Checkpointer(directory, keep=2)
    save_steps(ckpt, tiny_learner(), Replay(itertools.count()), (1, 2))
    ckpt.close()
    with pytest.raises(ConfigError, match="holds other arrays than this run's model") as e:
        Checkpointer(directory).resume(tiny_learner(hidden=24), Replay(itertools.count()))
    assert "\n" not in str(e.value)
    for step in (1, 2):
        with open(data_file(directory, step), "r+b") as f:
            f.truncate(10)
    ckpt = Checkpointer(directory, keep=1)
    with pytest.raises(ConfigError, match=r"no usable checkpoint .*step 2: it does not restore.*step 1: ") as e:
        ckpt.resume(tiny_learner(), Replay(itertools.count()))
    ckpt.close()  # as a loop's clean-up would: no rotation without a save of its own
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="config.init_from: the checkpoint of step 2 .* is unusable"):
        Checkpointer(directory).restore_params(tiny_learner().model)
    assert steps_on_disk(directory) == [1, 2] and not (directory / "bad").exists()
