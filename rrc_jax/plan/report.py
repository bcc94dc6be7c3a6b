"""What `python -m rrc_jax.plan` prints: the plan's table (`format_table`), whether it fits, the step's time, and
when it does not fit the mesh and micro-batch size that do (`suggest`)."""

from __future__ import annotations

import dataclasses

import jax

from rrc_jax.plan.hardware import GiB, HEADROOM, live_topology, slice_meshes, topology, Topology
from rrc_jax.plan.memory import PHASES, Plan, plan
from rrc_jax.plan import step_time
from rrc_jax.plan.step_time import format_times


def _factorizations(n: int) -> list[tuple[int, int, int]]:
    """Every (data, fsdp, tensor) with product n."""
    return [(d, n // t // d, t) for t in range(1, n + 1) if n % t == 0 for d in range(1, n // t + 1)
            if (n // t) % d == 0]


def _candidates(s, topo: Topology, shapes: list[tuple[int, int, int]] | None = None) -> list[Plan]:
    """Plans of every `(data, fsdp, tensor)` factorization of a slice's devices (or of `shapes` only) times the
    sizes across slices (`mesh.dcn`), every micro-batch size dividing `rl.minibatch_size`, with the config's remat
    setting and with remat."""
    mb, dcn = s.learner.minibatch_size, slice_meshes(s.mesh, topo)[1]
    return [plan(s, topo, mesh=(d * dcn[0], f * dcn[1], t * dcn[2]), micro_batch_size=micro, remat=remat, dcn=dcn)
            for remat in sorted({bool(s.learner.remat), True})
            for d, f, t in (shapes or _factorizations(topo.slice_devices))
            for micro in range(mb, 0, -1) if mb % micro == 0]


def slices_needed(s, topo: Topology, most: int = 16) -> tuple[Plan, str] | None:
    """When a run fits no single slice of `topo`'s kind: the fewest slices (2, 4, ... up to `most`) on which it
    fits, data (`mesh.dcn=N,1,1`: fewer rows a slice) or FSDP across them (`1,N,1`: the parameters and optimizer
    state over every slice), inside each slice the config's own mesh or FSDP over the slice with tensor 1 to 8;
    (its plan, its `mesh.dcn`) or None."""
    per = topology(topo.name).devices
    own = slice_meshes(dataclasses.replace(s.mesh, dcn="auto"), topology(topo.name))[0]
    shapes = list(dict.fromkeys([own] + [(1, per // t, t) for t in (1, 2, 4, 8) if per % t == 0]))
    for n in (2 ** k for k in range(1, most.bit_length())):
        for across in (f"{n},1,1", f"1,{n},1"):
            run = dataclasses.replace(s, mesh=dataclasses.replace(s.mesh, dcn=across))
            fitting = [c for c in _candidates(run, topology(topo.name, n), shapes) if c.fits]
            if fitting:
                return min(fitting, key=_preference), across
    return None


def suggest(s, topo: Topology | str) -> Plan | None:
    """The plan of a mesh, micro-batch size and remat setting that fit, or None: the first of the fitting
    candidates (`_candidates`) by `_preference`."""
    topo = topology(topo) if isinstance(topo, str) else topo
    return min((p for p in _candidates(s, topo) if p.fits), key=_preference, default=None)


def remat_choice(s, mesh) -> tuple[bool, str]:
    """`rl.remat` for a run of settings `s` on the JAX `mesh` (axes data, fsdp, tensor), and why: the config's when
    set; else the plan's on the mesh's devices when they report their memory (`live_topology`: off unless the run
    fits them only with remat), and off where they report none (XLA:CPU)."""
    if s.learner.remat is not None:
        return bool(s.learner.remat), "set by rl.remat"
    topo = live_topology(list(mesh.devices.flat), jax.process_index())
    if topo is None:
        return False, "unset, off: the devices report no memory limit to plan against"
    p = plan(s, topo, mesh=tuple(mesh.shape[a] for a in ("data", "fsdp", "tensor")))
    fit = f"{p.peak_bytes / GiB:.2f} of {topo.hbm_bytes / GiB:.2f} GiB per device"
    if p.remat:
        return True, f"unset, on: the plan fits {topo.name} only with it ({fit})"
    return False, (f"unset, off: the plan fits {topo.name} without it ({fit})" if p.fits else
                   f"unset, off: the plan does not fit {topo.name} either way ({fit}; python -m rrc_jax.plan)")


def judge_rows_choice(s, mesh):
    """The trainer's settings `s` with the judge's rows a call chosen from the memory of the JAX `mesh`'s devices
    (`reward.judge.fill_memory`: `step_time.judge_rows` on the plan of this run on them) where they report it,
    and a line saying what was chosen; `s` as it is otherwise (the line says why)."""
    judge = s.judge
    given = f"max_batch={judge.max_batch}, max_batch_tokens={judge.max_batch_tokens:,}"
    topo = live_topology(list(mesh.devices.flat), jax.process_index())
    if topo is None:
        return s, f"on, kept {given}: the devices report no memory limit to plan against"
    p = plan(s, topo, mesh=tuple(mesh.shape[a] for a in ("data", "fsdp", "tensor")))
    if "grm" not in p.layouts:
        return s, f"on, kept {given}: this run's judge runs no model here"
    filled = step_time.filled(s, p)
    return filled, (f"on: max_batch={filled.judge.max_batch}, max_batch_tokens={filled.judge.max_batch_tokens:,} "
                    f"fill the memory {topo.name} leaves the judge")


def _preference(p: Plan) -> tuple:
    """Sort key of fitting plans, best first: no remat, the least tensor parallelism, the largest micro-batch, the
    smallest peak."""
    return p.remat, p.mesh[2], -p.micro_batch, p.peak_bytes


def format_table(p: Plan) -> str:
    """The plan as a fixed-width table in GiB (2 decimals), phase totals, the fit line, problems and notes."""
    t = p.topology
    lines = [f"{t.name}: {t.devices} devices x {t.hbm_bytes / GiB:.0f} GiB HBM; mesh data={p.mesh[0]} "
             f"fsdp={p.mesh[1]} tensor={p.mesh[2]}; micro-batch {p.micro_batch or 'off'}; remat "
             f"{'on' if p.remat else 'off'}",
             f"{'component':<30} {'phase':<9} {'GiB/device':>10}  detail", "-" * 110]
    lines += [f"{r.name:<30} {r.phase:<9} {r.bytes / GiB:>10.2f}  {r.detail}" for r in p.rows]
    lines.append("-" * 110)
    lines += [f"{'total ' + phase:<40} {p.phase_bytes(phase) / GiB:>10.2f}" for phase in PHASES]
    lines.append(f"{'peak: resident + ' + p.largest_phase:<40} {p.peak_bytes / GiB:>10.2f}")
    lines.append(f"fits: {'yes' if p.fits else 'no'} ({p.peak_bytes / GiB:.2f} of {t.hbm_bytes / GiB:.2f} GiB; at "
                 f"most {HEADROOM:.0%} = {p.budget_bytes / GiB:.2f} GiB planned)")
    lines += [f"problem: {x}" for x in p.problems] + [f"note: {x}" for x in p.notes]
    return "\n".join(lines)


def report(s, topo: Topology | str, slices: int = 1) -> str:
    """`format_table` of the plan of a trainer's settings `s` on `slices` slices of `topo` and, when it does not fit,
    the suggestion (on one slice, and how many slices it would fit)."""
    p = plan(s, topology(topo, slices) if isinstance(topo, str) else topo)
    out = format_table(p)
    if not p.problems:
        out += "\n\n" + format_times(s, p)
    if p.fits:
        return out
    candidates = _candidates(s, p.topology)
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        usable = [c for c in candidates if not c.problems]
        low = min(usable, key=lambda c: c.peak_bytes, default=None)
        bf16 = " or --config.models.dtype=bfloat16" if s.models.dtype == "float32" else ""
        out += (f"\nsuggestion: nothing fits on {p.topology.name} (any mesh, micro-batch size, remat); use more "
                f"devices, shorter sequences{bf16}" + (
                    f". The smallest peak, {low.peak_bytes / GiB:.2f} GiB ({low.largest_phase}), is with "
                    f"{_flags(low)}" if low else ""))
        more = slices_needed(s, p.topology) if p.topology.slices == 1 else None
        if more:
            q, across = more
            what = "data" if across.endswith(",1,1") else "FSDP"
            out += (f"\nslices: it fits {q.topology.name} with {what} "
                    f"across slices: --slices={q.topology.slices} --config.mesh.dcn={across} {_flags(q)} "
                    f"({q.peak_bytes / GiB:.2f} of {q.topology.hbm_bytes / GiB:.2f} GiB); "
                    f"python -m rrc_jax.plan ... --slices={q.topology.slices} plans its step")
        return out
    s = min(fitting, key=_preference)
    return out + f"\nsuggestion: {_flags(s)} ({s.peak_bytes / GiB:.2f} of {s.topology.hbm_bytes / GiB:.2f} GiB)"


def _flags(p: Plan) -> str:
    """The flags of plan `p`'s mesh (its sizes inside a slice), micro-batch size and remat setting."""
    (d, f, t), (dd, fd, td) = p.mesh, p.dcn
    return (f"--config.mesh.data={d // dd} --config.mesh.fsdp={f // fd} --config.mesh.tensor={t // td} "
            f"--config.rl.micro_batch_size={p.micro_batch}" + (" --config.rl.remat=True" if p.remat else ""))
