"""Run with 8 CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`): which collectives of the compiled
programs cross slices on two slices of 4 devices (devices 0-3 and 4-7, `mesh.dcn=2,1,1`: the hybrid mesh's order,
data across slices, fsdp inside each). Prints one JSON line per program: each collective that crosses slices (its
op and whether it runs inside a loop, once per micro-batch or decode step), then `ok`; used by
`tests/test_slices.py`.

Replica groups are read in both of XLA's forms: explicit (`{{0,4},{1,5}}`) and iota (`[4,2]<=[2,4]T(1,0)`: the
iota of the dims, transposed, cut into groups)."""

import json
import re
import sys

import jax
import numpy as np
from flax import nnx

from plan_xla import CACHE_ROWS, CACHE_SLOTS, compiled_update, config, placed
from rrc_jax import plan
from rrc_jax.inference import kernels
from rrc_jax.inference.rollout_copy import RolloutCopy
from rrc_jax.inference.sampler import SamplingParams
from rrc_jax.models import Decoder
from rrc_jax.models.kv_cache import init_cache
from rrc_jax.sharding import Layout, MESH_AXES, model_context

SLICE = 4  # devices per slice
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def groups(attrs: str) -> list[list[int]]:
    """The device groups of a collective's attributes (`replica_groups=` or `source_target_pairs=`)."""
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))? "
                     r"\{([^}]*)\}", attrs)
    if mesh:  # a mesh of named axes (devices in iota order, or `device_ids`' transposed iota), grouped over some
        names = [a.split("=")[0].strip("'") for a in mesh[1].split(",")]
        sizes = [int(a.split("=")[1]) for a in mesh[1].split(",")]
        ids = np.arange(int(np.prod(sizes)))
        if mesh[2]:
            dims = [int(d) for d in mesh[2].split(",")]
            ids = ids.reshape(dims).transpose([int(p) for p in mesh[3].split(",")] if mesh[3] else None)
        over = [names.index(a.strip("' ")) for a in mesh[4].split(",")]
        ids = np.moveaxis(ids.reshape(sizes), over, list(range(len(sizes) - len(over), len(sizes))))
        return ids.reshape(-1, int(np.prod([sizes[a] for a in over]))).tolist()
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
    if iota:
        n, size, dims = int(iota[1]), int(iota[2]), [int(d) for d in iota[3].split(",")]
        ids = np.arange(np.prod(dims)).reshape(dims)
        if iota[4]:
            ids = ids.transpose([int(p) for p in iota[4].split(",")])
        return ids.reshape(n, size).tolist()
    listed = re.search(r"(?:replica_groups|source_target_pairs)=\{(\{[\d,{}]*\})\}", attrs)
    if listed:
        return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", listed[1])]
    return [list(range(8))]  # no groups: every device


def crossing(hlo: str) -> list[dict]:
    """The collectives of an HLO module's text whose groups span both slices: op, the bytes of its result and its
    loop depth (0: once per program; 1 inside a loop, e.g. the scan over layers or the decode loop; 2 inside a loop
    in a loop, e.g. each layer of each micro-batch)."""
    calls: dict[str, list[tuple[str, int]]] = {}  # computation -> (callee, 1 if a loop's body else 0)
    found, computation, entry = [], None, None
    for line in hlo.splitlines():
        head = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            computation = head[2]
            entry = computation if head[1] else entry
            continue
        for kind, callee in re.findall(r"(calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)", line):
            calls.setdefault(computation, []).append((callee, int(kind == "body")))
        op = next((c for c in COLLECTIVES if re.search(rf"\s{c}(-start)?\(", line)), None)
        if op and any(len({d // SLICE for d in g}) > 1 for g in groups(line)):
            shapes = re.findall(r"(f32|s32|pred|bf16)\[([\d,]*)\]", line.split(f" {op}")[0])
            size = sum(int(np.prod([int(d) for d in dims.split(",") if d] or [1])) * (1 if t == "pred" else 2 if
                                                                                     t == "bf16" else 4)
                       for t, dims in shapes)
            found.append((op, size, computation))
    depth, todo = {entry: 0}, [entry]
    while todo:
        c = todo.pop()
        for callee, loop in calls.get(c, ()):
            if depth.get(callee, -1) < depth[c] + loop:
                depth[callee] = depth[c] + loop
                todo.append(callee)
    return [{"op": op, "bytes": size, "depth": depth.get(c, 0)} for op, size, c in found]


def two_slices() -> jax.sharding.Mesh:
    """(2, 4, 1) with slice s's devices the data index s: `hybrid_mesh`'s order for slices of devices 0-3, 4-7."""
    return jax.sharding.Mesh(np.asarray(jax.devices()).reshape(2, SLICE, 1), MESH_AXES,
                             axis_types=(jax.sharding.AxisType.Auto,) * 3)


def update(micro: int) -> str:
    return compiled_update(config("float32"), two_slices(), micro).as_text()


def sync() -> str:
    cfg, train = config("float32"), two_slices()
    with model_context(None):
        master = RolloutCopy(Decoder(cfg, rngs=nnx.Rngs(0)), Layout(train, "train"), "float32").model
    inference = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(2, 1, SLICE), MESH_AXES,
                                  axis_types=(jax.sharding.AxisType.Auto,) * 3)
    copy = RolloutCopy(master, Layout(inference, "inference"), "float32")
    return copy._reshard.lower(copy._leaves(nnx.state(master, nnx.Param)), copy._values).compile().as_text()


def decode() -> str:
    cfg = config("float32", "float32")
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(2, 1, SLICE), MESH_AXES,
                             axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with jax.set_mesh(mesh):
        graphdef, state = placed(cfg, mesh, "inference")
        cache = jax.jit(lambda: init_cache(cfg, CACHE_ROWS, CACHE_SLOTS))()
        keys = kernels.row_keys(0, range(CACHE_ROWS))
        return kernels._decode.lower(graphdef, state, cache, keys, *kernels.to_the_end(np.ones(CACHE_ROWS, bool), 8, 0),
                                     params=SamplingParams(1.0, max_new_tokens=8), stop_ids=(2,), pad_id=0,
                                     impl="threefry2x32").compile().as_text()


def main() -> None:
    assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    counts = {"gradient_bytes": plan.param_bytes(config("float32"), "float32", (2, SLICE, 1))}
    for name, hlo in (("update", lambda: update(0)), ("update micro", lambda: update(8)), ("sync", sync),
                      ("decode", decode)):
        print(json.dumps({"program": name, "crossing": crossing(hlo()), **counts}), flush=True)
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
