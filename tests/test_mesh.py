"""Sharding on an 8-device CPU mesh (subprocesses with `--xla_force_host_platform_device_count=8`): model, sampler
and learner parity on every mesh shape (`mesh_parity.py`), and the trainer on a mesh: a 2-step AGR run with
`mesh.fsdp=8` completes and holds at most a sixth of the policy's parameter bytes per device of
mesh (1, 1, 1), and at most half of the GRM's (its inference layout splits it over tensor only); its checkpoint restores on mesh (2, 2, 2) and on one device with the same parameters, placed on the new mesh."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import cpu_devices_env

HERE = Path(__file__).resolve().parent
ENV = cpu_devices_env(8)


def test_models_samplers_and_the_learner_agree_with_one_device_on_every_mesh():
    out = subprocess.run([sys.executable, str(HERE / "mesh_parity.py")], env=ENV, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr[-3000:]
    assert out.stdout.count("match one device") == 4


def test_trainer_on_a_mesh_shards_its_parameters(tmp_path, toy_cache):
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(HERE)!r})
        from conftest import tiny_config
        from rrc_jax.config import validate
        from rrc_jax.rl.trainer import Trainer
        shared = {{"reward.agr.anchors_path": {str(tmp_path)!r} + "/anchors.jsonl"}}  # made once, read after
        sharded = {{}}
        for name, (data, fsdp, tensor) in {{"fsdp8": (1, 8, 1), "fsdp4_tensor2": (1, 4, 2)}}.items():
            config = tiny_config("agr", {str(tmp_path)!r} + "/" + name, {str(toy_cache)!r}, steps=2,
                                 **{{"mesh.data": data, "mesh.fsdp": fsdp, "mesh.tensor": tensor, "eval.every": 0,
                                    "eval.judge_votes": 0, **shared}})
            if name == "fsdp8":
                Trainer(validate(config)).run()
            else:
                sharded[name] = Trainer(validate(config)).memory()
        one = tiny_config("agr", {str(tmp_path)!r} + "/one", {str(toy_cache)!r},
                          **{{"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1, **shared}})
        print(json.dumps({{"one": Trainer(validate(one)).memory(), **sharded}}))

        # The fsdp=8 run's checkpoint (step 2) on other meshes: same parameters, each placed on the new mesh.
        import shutil
        import jax, numpy as np
        from flax import nnx
        from rrc_jax.checkpoint import Checkpointer
        from rrc_jax.models import load_hf
        saved = nnx.to_pure_dict(nnx.state(load_hf({str(tmp_path)!r} + "/fsdp8/hf_export"), nnx.Param))
        for name, (data, fsdp, tensor) in {{"mesh222": (2, 2, 2), "device1": (1, 1, 1)}}.items():
            workdir = {str(tmp_path)!r} + "/" + name
            shutil.copytree({str(tmp_path)!r} + "/fsdp8/checkpoints", workdir + "/checkpoints")
            config = tiny_config("agr", workdir, {str(toy_cache)!r}, steps=3,
                                 **{{"mesh.data": data, "mesh.fsdp": fsdp, "mesh.tensor": tensor, "eval.every": 0,
                                    "eval.judge_votes": 0, **shared}})
            trainer = Trainer(validate(config))
            with jax.set_mesh(trainer.mesh):
                step = Checkpointer(workdir + "/checkpoints").restore(trainer.learner, trainer.batches)
            restored = nnx.to_pure_dict(trainer.learner.params)
            assert step == 2
            for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(restored)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
                assert b.sharding.mesh.shape_tuple == trainer.mesh.shape_tuple, (b.sharding, trainer.mesh)
            print(name, "restored")  # the run itself resumes like this (tests/test_multihost.py runs one)
    """)
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=900,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    memory = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    rows = [json.loads(line) for line in (tmp_path / "fsdp8" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and all(r["judge/questions"] > 0 for r in rows[1:])
    key = "memory/policy_params_bytes_per_device"  # the training layout: FSDP over the 8 devices
    one = memory["one"][key]
    assert rows[0][key] * 6 <= one, (rows[0][key], one)
    assert memory["fsdp4_tensor2"][key] * 6 <= one, (memory["fsdp4_tensor2"][key], one)
    assert rows[0]["memory/reference_params_bytes_per_device"] == rows[0][key]  # the same model, the same layout
    key = "memory/grm_params_bytes_per_device"  # the inference layout: split over tensor only, as far as the heads go
    assert rows[0][key] * 2 <= memory["one"][key] and memory["fsdp4_tensor2"][key] * 2 <= memory["one"][key]
    assert rows[1]["memory/weight_sync_bytes_per_device"] > 0  # the rollout copy, resharded after the update
    assert rows[0]["memory/optimizer_bytes_per_device"] * 6 <= memory["one"]["memory/optimizer_bytes_per_device"]
    assert "mesh222 restored" in out.stdout and "device1 restored" in out.stdout
