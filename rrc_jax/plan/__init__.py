"""Memory planner: will a GRPO run of a trainer config fit a TPU slice or GPU host, and on which mesh?

    python -m rrc_jax.plan --config=agr.py --topology=v5e-64 [--config.models.policy=llama3-8b
        --config.models.grm=llama3-8b --config.mesh.fsdp=... --config.rl.micro_batch_size=...]

prints, per device, what the run holds in high-bandwidth memory, whether it fits, and, when it does not, a mesh and
micro-batch size that do. Nothing is loaded or compiled: the figures are arithmetic on the model shapes
(`DecoderConfig`: a size preset such as `llama3-8b`, a Hugging Face directory's `config.json`, or `toy`) and the
config. `tests/test_plan.py` checks them against XLA's own accounting of the compiled learner update and decode
step on an 8-device CPU mesh.

One module a part: the accelerators and meshes (`hardware`), the models and their parameters (`shapes`), the
judge's work in a call (`judge_work`), the memory of a step (`memory`, `plan`), its time (`step_time`), what the
command prints (`report`) and the command line (`__main__`). The model of memory (a resident part plus the largest
of the phases; what each row counts, and the check against XLA) and of the judge's work is in docs/planner.md.
"""

from rrc_jax.plan.hardware import (ACCELERATORS, GiB, HEADROOM, Topology, live_topology, resolve_mesh,
                                   topology)
from rrc_jax.plan.memory import (LOGPROB_CHUNK_ARRAYS, PHASES, Plan, Row, activation_bytes, branched_cache_bytes,
                                 decode_step_bytes, forward_bytes, gathered_bytes, inference_shape, kv_cache_bytes,
                                 layer_activation_bytes, layer_param_bytes, logprob_chunk_bytes, plan, role_layouts,
                                 roles, shared_block, sync_transient_bytes, tree_cache_bytes)
from rrc_jax.plan.judge_work import JudgeWork, judge_chunk, judge_work
from rrc_jax.plan.report import format_table, judge_rows_choice, remat_choice, report, suggest
from rrc_jax.plan.shapes import (PRESETS, lora_param_bytes, matmul_params, mesh_axes, model_config, param_bytes,
                                 param_count, param_shapes)
from rrc_jax.plan.step_time import (JETSTREAM, PhaseTime, decode_time, forward_time, jetstream_prediction, judge_chips,
                                    step_times)

__all__ = ["ACCELERATORS", "GiB", "HEADROOM", "Topology", "live_topology", "resolve_mesh", "topology",
           "LOGPROB_CHUNK_ARRAYS", "PHASES",
           "Plan", "Row", "activation_bytes", "branched_cache_bytes", "decode_step_bytes", "forward_bytes",
           "gathered_bytes", "inference_shape", "JudgeWork", "judge_chunk", "judge_work", "kv_cache_bytes",
           "layer_activation_bytes", "layer_param_bytes", "tree_cache_bytes", "logprob_chunk_bytes", "plan",
           "role_layouts", "roles", "shared_block", "sync_transient_bytes", "format_table", "judge_rows_choice",
           "remat_choice", "report",
           "suggest",
           "PRESETS", "lora_param_bytes", "matmul_params", "mesh_axes", "model_config", "param_bytes", "param_count",
           "param_shapes", "JETSTREAM", "PhaseTime", "decode_time", "forward_time", "jetstream_prediction",
           "judge_chips", "step_times"]
