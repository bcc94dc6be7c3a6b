"""A roofline of one step's seconds per phase (docs/planner.md, "Time"): each phase bound by FLOPs, HBM traffic or
the interconnect, checked against a published JetStream figure (`jetstream_prediction`)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from rrc_jax.constructions.registry import CONSTRUCTIONS
from rrc_jax.errors import ConfigError
from rrc_jax.models.batches import bucket_length
from rrc_jax.models.kv_cache import ATTENTION_BLOCK
from rrc_jax.plan.hardware import GiB, Topology, split_size, topology
from rrc_jax.inference.lanes import LanePlan, lane_plan
from rrc_jax.plan.judge_work import JudgeWork, judge_work, template_tokens
from rrc_jax.plan.memory import PHASES, Plan, gather_traffic_bytes, layer_slots, plan
from rrc_jax.sharding import replica_sums
from rrc_jax.plan.shapes import itemsize, matmul_params, model_config, param_bytes, weight_bytes

# JetStream serving Llama-3-8B in bf16 on a v5e-8 at batch 128, 1,024 tokens in and out: 8,249 tokens/s
# (AI-Hypercomputer/jetstream-pytorch, benchmarks/summary.md): the planner's sanity anchor.
JETSTREAM = dict(model="llama3-8b", topology="v5e-8", rows=128, prompt=1024, new=1024, tokens_per_s=8249.0)


@dataclasses.dataclass(frozen=True)
class PhaseTime:
    """Seconds of one phase of a step, what bounds it (compute, HBM or interconnect) and how it was counted."""

    name: str
    seconds: float
    bound: str
    detail: str = ""


def _kv_slot_bytes(cfg, dtype: str, tensor: int) -> int:
    """Bytes per device of one token's keys and values in one layer."""
    return 2 * split_size(cfg.num_kv_heads, tensor) * cfg.head_dim * itemsize(cfg.kv_dtype or dtype)


def _roofline(topo: Topology, flops: float, hbm: float, ici: float) -> tuple[float, str]:
    """max(compute, HBM) plus the interconnect (not overlapped: an upper bound), and the largest term."""
    terms = {"compute": flops / topo.flops, "HBM": hbm / topo.hbm_bw, "interconnect": ici / topo.ici_bw}
    return max(terms["compute"], terms["HBM"]) + terms["interconnect"], max(terms, key=terms.get)


def _allreduce_bytes(cfg, rows: float, dtype: str, tensor: int) -> float:
    """Bytes a device sends per forward of `rows` tokens in the inference layout: two ring all-reduces of
    `[rows, embed]` per layer (after attention and after the MLP) over `tensor` devices."""
    return 2 * cfg.num_layers * rows * cfg.hidden_size * itemsize(dtype) * 2 * (tensor - 1) / tensor


def forward_time(topo: Topology, cfg, dtype: str, shape, layout: str, tokens: float, qtype: str = ""
                 ) -> tuple[float, str]:
    """A forward pass over `tokens` tokens (rows over the mesh's row groups): every weight read once, 2 FLOP per
    parameter and token, and the layout's communication (the inference layout's all-reduces; the training
    layout's gather of every weight over fsdp, a layer at a time)."""
    groups, tensor = shape[0] * shape[1], shape[2]
    flops = 2 * matmul_params(cfg) * tokens / (groups * tensor)
    hbm = weight_bytes(cfg, dtype, shape, layout, qtype)
    ici = (_allreduce_bytes(cfg, tokens / groups, dtype, tensor) if layout == "inference"
           else gather_traffic_bytes(cfg, dtype, shape))
    return _roofline(topo, flops, hbm, ici)


def decode_step_reads(cfg, dtype: str, shape, layout: str, rows: int, prefixes: int, prefix: int,
                      cached: float, qtype: str = "") -> tuple[float, float]:
    """Bytes a device reads in one decode step of `rows` rows continuing `prefixes` shared prefixes of `prefix`
    tokens, each row holding `cached` tokens of its own (a sliding layer at most its window): (the weights, the
    cache), each shared prefix read once for its rows."""
    groups, tensor = shape[0] * shape[1], shape[2]
    kv = _kv_slot_bytes(cfg, dtype, tensor)
    cache = (-(-prefixes // groups) * prefix * cfg.num_layers + -(-rows // groups) * layer_slots(cfg, cached)) * kv
    return weight_bytes(cfg, dtype, shape, layout, qtype), cache


def decode_time(topo: Topology, cfg, dtype: str, shape, layout: str, rows: int, steps: int, prefixes: int,
                prefix: int, own: int, mean_new: float | None = None, qtype: str = "") -> tuple[float, str]:
    """`steps` decode steps of `rows` rows continuing `prefixes` shared prefixes of `prefix` tokens, each row with
    `own` tokens of its own before its first step and `mean_new` decoded on average through the steps (default
    `steps / 2`: every row from the first step to the last): per step every weight and every cached token read
    once (a shared prefix once for its rows), 2 FLOP per parameter and row, and the layout's communication."""
    groups, tensor = shape[0] * shape[1], shape[2]
    per_row = -(-rows // groups)
    weights, cache = decode_step_reads(cfg, dtype, shape, layout, rows, prefixes, prefix,
                                       own + (steps / 2 if mean_new is None else mean_new), qtype)
    flops = 2 * matmul_params(cfg) * per_row / tensor
    ici = (_allreduce_bytes(cfg, per_row, dtype, tensor) if layout == "inference"
           else gather_traffic_bytes(cfg, dtype, shape))  # the training layout gathers every layer at every step
    step, bound = _roofline(topo, flops, weights + cache, ici)
    return steps * step, bound


def judge_config(s):
    """The GRM's `DecoderConfig` as the judge runs it: its KV cache stored as `reward.judge.kv_dtype` says."""
    return model_config(s.models.grm, field="models.grm").replace(kv_dtype=s.judge.kv_dtype)


def expected_tokens(s) -> int:
    """The judgments' expected length: `reward.judge.expected_tokens`, else the limit."""
    return s.judge.expected_tokens or s.judge.max_new_tokens


def judge_lanes(s, work: JudgeWork) -> LanePlan:
    """The lanes the engine decodes a step's questions in with continuous batching (`lanes.lane_plan`, on the
    planner's question lengths): a lane keeps its question below the prompt, the first response included."""
    return lane_plan([work.prefix] * work.prompts, [s.reward.judge_load(s).questions] * work.prompts,
                     question_tokens(s), s.judge.max_new_tokens, s.judge.max_batch, s.judge.max_batch_tokens)


def question_tokens(s) -> int:
    """A judge question's tokens below its prompt (its responses and the template's text around them)."""
    _, head, tail = template_tokens(s)
    return 2 * s.rollout.max_new_tokens + head + tail


class JudgeDecode(NamedTuple):
    """The judge's decode of a step as `decode_time` counts it: `rows` advanced a step for `steps` steps (per chunk,
    `calls` of them), continuing `prefixes` shared prefixes of `prefix` slots, each row with `own` tokens before its
    first step and `mean_new` decoded on average."""

    calls: int
    rows: int
    steps: int
    prefixes: int
    prefix: int
    own: int
    mean_new: float


def judge_decode(s, work: JudgeWork) -> JudgeDecode:
    """The `JudgeDecode` of `work`: in chunks that decode until their longest judgment ends (each `max_new_tokens`),
    or with `reward.judge.continuous` in lanes (`judge_lanes`) that decode `expected_tokens` a question."""
    if s.judge.continuous:
        lanes, mean = judge_lanes(s, work), expected_tokens(s)
        return JudgeDecode(1, lanes.rows, -(-work.questions * mean // lanes.rows), lanes.slots, work.prefix,
                           question_tokens(s), mean / 2)
    chunk = min(work.questions, work.rows)  # (at most max_batch rows, within max_batch_tokens)
    p_, f, m, c = work.chunk
    shared = p_ * work.prefix + p_ * f * work.first + (p_ * f * m * work.rest if c > 1 else 0)
    leaves = p_ * f * m  # the shared levels' slots a chunk's rows read, spread over its questions
    n = s.judge.max_new_tokens
    return JudgeDecode(-(-work.questions // chunk), chunk, n, max(1, leaves * chunk // work.rows), shared // leaves,
                       0 if c > 1 else work.rest, n / 2)


def judge_phases(s, p: Plan, tree: bool = True) -> list[PhaseTime]:
    """The judge's prefill and decode of a step (`judge_decode`); with `reward.judge.continuous` each different
    question is prefilled below its prompt."""
    rl, judge = s.rollout, s.judge
    grm, (glayout, gwhere) = judge_config(s), p.layouts["grm"]
    work = judge_work(s, s.reward.judge_load(s), rl.prompts_per_step)
    d = judge_decode(s, work)
    seconds, bound = decode_time(p.topology, grm, s.models.dtype, gwhere, glayout, d.rows, d.steps, d.prefixes,
                                 d.prefix, d.own, d.mean_new, judge.weight_qtype)
    if judge.continuous:  # each different question prefilled once for its votes
        tokens = rl.prompts_per_step * (work.prefix + s.reward.judge_load(s).leaves * question_tokens(s))
        lanes = judge_lanes(s, work)
        return [PhaseTime("judge prefill", *forward_time(p.topology, grm, s.models.dtype, gwhere, glayout, tokens,
                                                         judge.weight_qtype),
                          f"{tokens:,} tokens: {rl.prompts_per_step} prefixes x {work.prefix}, each different "
                          f"question's {question_tokens(s)} below its prompt (continuous batching)"),
                PhaseTime("judge decode", seconds, bound, f"{work.questions} questions x {expected_tokens(s)} tokens "
                          f"expected in {lanes.rows} lanes ({lanes.slots} prompts x {lanes.lanes}), {d.steps:,} "
                          f"steps, {glayout} layout (continuous batching)")]
    prefill = forward_time(p.topology, grm, s.models.dtype, gwhere, glayout,
                           work.prefill_tokens if tree else work.flat_prefill_tokens, judge.weight_qtype)
    return [PhaseTime("judge prefill", *prefill, f"{work.prefill_tokens:,} tokens: {rl.prompts_per_step} prefixes "
                                                 f"x {work.prefix}, firsts x {work.first}, questions x "
                                                 f"{work.rest} ({work.flat_prefill_tokens:,} without the tree)"),
            PhaseTime("judge decode", d.calls * seconds, bound,
                      f"{d.calls} chunks of {d.rows} questions x {judge.max_new_tokens} tokens, {glayout} layout")]


def judge_rows(s, p: Plan, own: bool = False) -> tuple[int, int]:
    """(`reward.judge.max_batch`, `max_batch_tokens`) that fill the memory plan `p` leaves the judge's cache in its
    reward phase: the budget less the resident part (with `own`, on chips of the judge's own: its weights alone,
    stored as `reward.judge.weight_qtype` says) and the phase's other rows, in cache slots of every layer over the
    judge's data groups; the rows then as many as those slots hold (the slots bind)."""
    grm, (layout, shape) = judge_config(s), p.layouts["grm"]
    cache = sum(r.bytes for r in p.rows if r.name == "judge KV cache")
    resident = (weight_bytes(grm, s.models.dtype, shape, layout, s.judge.weight_qtype) if own
                else p.phase_bytes("resident"))
    free = p.budget_bytes - resident - p.phase_bytes("reward") + cache
    per_slot = grm.num_layers * _kv_slot_bytes(grm, s.models.dtype, shape[2])
    slots = max(1, free // per_slot) * shape[0] * shape[1]
    return max(1, slots // ATTENTION_BLOCK), int(slots)


def with_judge(s, **changes):
    """The trainer's settings `s` with `reward.judge`'s fields `changes`."""
    return dataclasses.replace(s, judge=dataclasses.replace(s.judge, **changes))


# the schedule of the levers' last line (`lever_lines`), at the run's settings of it: of the study's constructions
# asking at most half the round robin's questions, the one with the highest mean Kendall tau, the active schedule at
# budget 0.5 (docs/study.md, "Fewer judge questions"); planned at its budget (the most it asks: copies ask fewer)
SCHEDULE = "active"


def with_reward(s, kind: str):
    """The trainer's settings `s` rewarded by construction `kind` at its config group's values (None when the run's
    config has no such group, as for a plug-in's run)."""
    if kind not in s.constructions:
        return None
    return dataclasses.replace(s, reward=CONSTRUCTIONS[kind], reward_kind=kind)


def filled(s, p: Plan, own: bool = False):
    """`s` with the judge's rows filling its memory on plan `p` (`judge_rows`)."""
    rows, slots = judge_rows(s, p, own)
    return with_judge(s, max_batch=rows, max_batch_tokens=slots)


def judge_decode_reads(s, p: Plan) -> tuple[int, float, float]:
    """The judge's decode step as configured (`judge_decode`): (rows a replica advances, bytes of weights and of
    cache a device reads), the cache at its mean length over the step's judgments."""
    glayout, gwhere = p.layouts["grm"]
    d = judge_decode(s, judge_work(s, s.reward.judge_load(s), s.rollout.prompts_per_step))
    reads = decode_step_reads(judge_config(s), s.models.dtype, gwhere, glayout, d.rows, d.prefixes, d.prefix,
                              d.own + d.mean_new, s.judge.weight_qtype)
    return -(-d.rows // (gwhere[0] * gwhere[1])), *reads


def lever_lines(s, p: Plan) -> list[str]:
    """The judge chips to keep pace (`judge_chips`) with each lever added in turn: chunks, continuous batching at the
    expected judgment length, rows that fill chips of the judge's own, int8 weights, a float8 KV cache, and fewer
    questions (the schedule `SCHEDULE` in place of the run's reward); and what bounds the judge's decode step as
    configured."""
    devices, out = p.topology.devices, []
    given = with_judge(s, fill_memory=False)
    chunks, lanes = with_judge(given, continuous=False), with_judge(given, continuous=True)
    int8 = with_judge(lanes, weight_qtype="int8")
    fp8 = with_judge(int8, kv_dtype="float8_e4m3fn")
    full, full8, full_kv = filled(lanes, p, own=True), filled(int8, p, own=True), filled(fp8, p, own=True)
    for what, x in ((f"chunks decoding to their longest judgment, {s.judge.max_batch} rows and "
                     f"{s.judge.max_batch_tokens:,} slots a call", chunks),
                    (f"+ continuous batching, judgments of {expected_tokens(s)} tokens expected "
                     "(reward.judge.continuous, reward.judge.expected_tokens)", lanes),
                    (f"+ rows that fill the memory of chips of the judge's own, {full.judge.max_batch_tokens:,} "
                     "slots a call (reward.judge.fill_memory)", full),
                    (f"+ int8 weights, the rows filling what they leave, {full8.judge.max_batch_tokens:,} slots a call "
                     "(reward.judge.weight_qtype=int8)", full8),
                    (f"+ a float8 KV cache, {full_kv.judge.max_batch_tokens:,} slots a call "
                     "(reward.judge.kv_dtype=float8_e4m3fn)", full_kv)):
        times = step_times(x, p)
        judge = sum(t.seconds for t in times if t.name.startswith("judge"))
        out.append(f"judge chips to keep pace, {what}: {judge_chips(times, devices):,} ({judge:.1f} s of judging)")
    fewer = with_reward(fp8, SCHEDULE)
    if fewer is not None and s.reward_kind != SCHEDULE:
        x, load, m = filled(fewer, p, own=True), fewer.reward.judge_load(fewer), s.rollout.group_size
        times = step_times(x, p)
        judge = sum(t.seconds for t in times if t.name.startswith("judge"))
        out.append(f"judge chips to keep pace, + fewer questions, reward.kind={SCHEDULE} at its settings "
                   f"({load.questions // s.judge.votes} of {m * (m - 1) // 2} pairs a group): "
                   f"{load.questions * s.rollout.prompts_per_step:,} questions a step instead of "
                   f"{s.reward.judge_load(s).questions * s.rollout.prompts_per_step:,}: "
                   f"{judge_chips(times, devices):,} ({judge:.1f} s of judging)")
    rows, weights, cache = judge_decode_reads(filled(given, p) if s.judge.fill_memory else s, p)
    out.append(f"judge decode step: {rows} rows a replica, {weights / GiB:.2f} GiB of weights and {cache / GiB:.2f} "
               f"GiB of cache a chip read: bound by its {'weights' if weights >= cache else 'cache'}")
    return out


def step_times(s, p: Plan, tree: bool = True) -> list[PhaseTime]:
    """The roofline seconds of each phase of one step of the trainer's settings `s` on plan `p`'s topology and
    layouts; `tree=False`: the judge prefilling every vote on its own after its prompt's prefix (`JudgeWork.flat`).
    With `reward.judge.fill_memory`, the judge's rows fill its memory (`judge_rows`)."""
    if s.judge.fill_memory and "grm" in p.layouts:
        s = filled(with_judge(s, fill_memory=False), p)
    topo, rl, learner, dtype = p.topology, s.rollout, s.learner, s.models.dtype
    policy = model_config(s.models.policy)
    prompt = bucket_length(s.prompts.data.max_prompt_tokens)
    rows, new = rl.prompts_per_step * rl.group_size, rl.max_new_tokens
    layout, where = p.layouts.get("rollout", p.layouts["policy"])
    stored = dtype if layout == "inference" else "float32"
    out = [PhaseTime("rollout prefill", *forward_time(topo, policy, stored, where, layout, rl.prompts_per_step * prompt),
                     f"{rl.prompts_per_step} prompts x {prompt} tokens, each once for its group"),
           PhaseTime("rollout decode", *decode_time(topo, policy, stored, where, layout, rows, new, rl.prompts_per_step,
                                                    prompt, 0),
                     f"{rows} rows x {new} tokens, {layout} layout (data={where[0] * where[1]} tensor={where[2]})")]
    if "grm" in p.layouts:
        out += judge_phases(s, p, tree)
    length, shape = prompt + new, p.mesh
    passes = int(learner.mu > 1 or learner.minibatch_size < rows) + int(s.grpo.beta > 0)
    if passes:
        one, bound = forward_time(topo, policy, "float32", shape, "train", rows * length)
        out.append(PhaseTime("log-prob passes", passes * one, bound, f"{passes} x {rows} rows x {length} tokens"))
    updates = learner.mu * -(-rows // learner.minibatch_size)
    flops = (8 if p.remat else 6) * matmul_params(policy) * learner.mu * rows * length / topo.devices
    ici = updates * 3 * gather_traffic_bytes(policy, "float32", shape)  # gather (forward, backward), reduce-scatter
    out.append(PhaseTime("update", *_roofline(topo, flops, updates * 3 * p.rows[0].bytes, ici),
                         f"{updates} updates, {'8' if p.remat else '6'} FLOP per parameter and token"))
    if "rollout" in p.layouts:
        copy = param_bytes(policy, dtype, p.layouts["rollout"][1], "inference")
        out.append(PhaseTime("weight sync", copy / topo.ici_bw, "interconnect",
                             f"{copy / GiB:.2f} GiB a device into the rollout copy"))
    return out + [PhaseTime(name, sent / topo.dcn_bw, "DCN", detail) for name, sent, detail in dcn_traffic(s, p)]


def dcn_traffic(s, p: Plan) -> list[tuple[str, float, str]]:
    """What a device sends over the data-center network in a step on several slices (`Plan.dcn`): (phase, bytes, how
    counted). Data across slices: each gradient shard all-reduced over them (a ring: 2 (d - 1) / d of it) once per
    update, micro-batches or not (the learner accumulates inside each replica; tests/test_slices.py checks the
    compiled update), else once per micro-batch (`rrc_jax.sharding.replica_sums`: tensor > 1, say); FSDP across slices:
    every pass's weight gathers bring (f - 1) / f of the weights from other slices (3 a micro-batch: gathers forward
    and backward, the gradients' reduce-scatter; one a log-prob pass), and the rollout copy's reshard as much of the
    copy; without a rollout copy (`rl.share_weights`) every decode step's gathers, and the judge's in the training
    layout. Nothing else crosses: rows and tensor stay inside a slice (decoding's per-step bookkeeping, a few bytes a
    row, is not counted)."""
    data, fsdp, _ = p.dcn
    if data * fsdp == 1:
        return []
    rl, learner = s.rollout, s.learner
    policy, rows = model_config(s.models.policy), rl.prompts_per_step * rl.group_size
    updates = learner.mu * -(-rows // learner.minibatch_size)
    micro = learner.minibatch_size // p.micro_batch if 0 < p.micro_batch < learner.minibatch_size else 1
    shard = p.rows[1 if s.lora.enabled else 0].bytes  # a device's float32 gradient (under LoRA the adapters')
    out = []
    if data > 1:  # summed inside each replica where the learner can (`sharding.replica_sums`)
        once = replica_sums(p.mesh[0], p.mesh[2], learner.minibatch_size, micro)
        reductions = updates * (1 if once else micro)
        out.append(("gradients over DCN", reductions * 2 * (data - 1) / data * shard,
                    f"{shard / GiB:.2f} GiB a device all-reduced over {data} slices, {reductions} times (once an "
                    f"update{'' if once else ' and micro-batch'})"))
    if fsdp > 1:
        passes = updates * micro * 3 + int(learner.mu > 1 or learner.minibatch_size < rows) + int(s.grpo.beta > 0)
        gathered = gather_traffic_bytes(policy, "float32", p.mesh) * (fsdp - 1) / fsdp
        out.append(("FSDP gathers over DCN", passes * gathered,
                    f"{passes} passes x {gathered / GiB:.2f} GiB of weights from the other {fsdp - 1} slices"))
        if "rollout" in p.layouts:
            copy = param_bytes(policy, s.models.dtype, p.layouts["rollout"][1], "inference") * (fsdp - 1) / fsdp
            out.append(("weight sync over DCN", copy, f"{copy / GiB:.2f} GiB of the rollout copy from other slices"))
        else:  # sampling from the master (`rl.share_weights`): every decode step gathers every weight
            steps = rl.max_new_tokens + 1
            out.append(("rollout gathers over DCN", steps * gathered,
                        f"{steps} decode steps (and the prefill) in the training layout x {gathered / GiB:.2f} GiB"))
        if p.layouts.get("grm", ("",))[0] == "train":  # a judge in the training layout (`mesh.grm=train`) likewise
            d = judge_decode(s, judge_work(s, s.reward.judge_load(s), rl.prompts_per_step))
            grm = gather_traffic_bytes(judge_config(s), s.models.dtype, p.mesh) * (fsdp - 1) / fsdp
            out.append(("judge gathers over DCN", d.calls * (d.steps + 1) * grm,
                        f"{d.calls} calls x {d.steps + 1} steps in the training layout x {grm / GiB:.2f} GiB"))
    return out


def dcn_line(p: Plan, times: list[PhaseTime]) -> str:
    """On several slices: the bytes a chip sends over DCN a step (its DCN phases' seconds at `dcn_bw`), their seconds
    and whether DCN bounds the step (its phases the longest of the step's)."""
    topo, total = p.topology, sum(t.seconds for t in times)
    seconds = sum(t.seconds for t in times if t.bound == "DCN")
    sent = seconds * topo.dcn_bw
    longest = max((t for t in times if t.bound != "DCN"), key=lambda t: t.seconds)
    across = f"mesh.dcn data={p.dcn[0]} fsdp={p.dcn[1]} tensor={p.dcn[2]}"
    bound = (f"yes: more than its longest other phase, {longest.name} ({longest.seconds:.2f} s)" if seconds >
             longest.seconds else f"no: its longest phase is {longest.name} ({longest.seconds:.2f} s)")
    return (f"DCN over {topo.slices} slices ({across}; {topo.dcn_bw / 1e9:.3g} GB/s a chip one way): "
            f"{sent / GiB:.2f} GiB a chip a step, {seconds:.2f} s of the step's {total:.2f} s; DCN bounds the step: "
            f"{bound}")


def judge_chips(times: list[PhaseTime], devices: int) -> int:
    """Chips of the same kind a judge on chips of its own needs to keep pace with a policy on `devices` chips, its
    steps overlapped with the judging (the judge serving one step's questions while the policy samples and learns
    the next): the judge's seconds of `times` (on every chip) scaled to take no longer than the rest of the step,
    `ceil(devices x judge / rest)`; 0 without a judge."""
    judge = sum(t.seconds for t in times if t.name.startswith("judge"))
    rest = sum(t.seconds for t in times) - judge
    return -(-int(devices * judge * 1000) // max(1, int(rest * 1000))) if judge else 0


@dataclasses.dataclass(frozen=True)
class Split:
    """The asynchronous step (`rl.max_staleness >= 1`, `rrc_jax.rl.pipeline`) with the judge on `judge` of the
    chips and the policy on the rest: each side's chain of phases (seconds) and peak bytes per chip, from plans of
    the run on each side's chips alone (the policy's without the GRM and its reward phase, the judge's of the GRM
    and that phase)."""

    judge: int
    policy_seconds: float
    judge_seconds: float
    policy_bytes: int
    judge_bytes: int
    budget_bytes: int

    @property
    def seconds(self) -> float:
        """The step: the longer chain (while the judge judges one step's rollouts, the policy samples the next and
        learns)."""
        return max(self.policy_seconds, self.judge_seconds)

    @property
    def fits(self) -> bool:
        return max(self.policy_bytes, self.judge_bytes) <= self.budget_bytes


def pipelined_step(s, p: Plan, judge: int) -> Split:
    """The `Split` of plan `p`'s chips with `judge` of them the judge's (whole hosts)."""
    one = dataclasses.replace(s, mesh=dataclasses.replace(s.mesh, dcn="auto"))  # each side one group of chips

    def side(devices: int) -> tuple[Plan, list[PhaseTime]]:
        topo = dataclasses.replace(p.topology, devices=devices, name=f"{p.topology.name}[{devices}]", slices=1)
        part = plan(one, topo, micro_batch_size=p.micro_batch, remat=p.remat)
        return part, step_times(one, part)

    (pol, pol_times), (jud, jud_times) = side(p.topology.devices - judge), side(judge)
    judging = lambda t: t.name.startswith("judge")  # noqa: E731
    grm = lambda r: r.name.startswith("grm")  # noqa: E731
    policy_resident = sum(r.bytes for r in pol.rows if r.phase == "resident" and not grm(r))
    policy_peak = policy_resident + max(pol.phase_bytes(ph) for ph in PHASES[1:] if ph != "reward")
    judge_peak = sum(r.bytes for r in jud.rows if grm(r)) + jud.phase_bytes("reward")
    return Split(judge, sum(t.seconds for t in pol_times if not judging(t)),
                 sum(t.seconds for t in jud_times if judging(t)), policy_peak, judge_peak, p.budget_bytes)


def judge_split(s, p: Plan) -> Split | None:
    """The split of `p`'s chips, in whole hosts, whose pipelined step is shortest among those where both sides fit
    (`pipelined_step`); None when none fits or there is no judge."""
    unit, devices = p.topology.host_devices, p.topology.devices
    if "grm" not in p.layouts:
        return None
    def split(judge: int) -> Split | None:
        try:
            return pipelined_step(s, p, judge)
        except ConfigError:  # e.g. a `mesh.inference` shape that does not divide one side's chips
            return None

    fitting = [x for x in map(split, range(unit, devices, unit)) if x is not None and x.fits]
    return min(fitting, key=lambda x: (x.seconds, x.judge), default=None)


def decode_tokens_per_s(s, p: Plan, times: list[PhaseTime]) -> float:
    """Rollout tokens a chip decodes per second (its prefill included)."""
    rollout = sum(t.seconds for t in times if t.name.startswith("rollout"))
    return s.rollout.rows * s.rollout.max_new_tokens / rollout / p.topology.devices


def jetstream_prediction() -> float:
    """The roofline's tokens/s (all chips) for `JETSTREAM`'s configuration: prefill then decode of every row, the
    model in the inference layout over the host's 8 chips."""
    j, topo = JETSTREAM, topology(JETSTREAM["topology"])
    cfg, shape = model_config(j["model"]), (1, 1, topo.devices)
    prefill = forward_time(topo, cfg, "bfloat16", shape, "inference", j["rows"] * j["prompt"])[0]
    decode = decode_time(topo, cfg, "bfloat16", shape, "inference", j["rows"], j["new"], j["rows"], j["prompt"], 0)[0]
    return j["rows"] * j["new"] / (prefill + decode)


def pipelined_lines(s, p: Plan, times: list[PhaseTime]) -> list[str]:
    """The pipelined step beside the synchronous one: with `mesh.judge_devices` when set, and the fitting split
    (whole hosts) that makes it shortest."""
    total, devices = sum(t.seconds for t in times), p.topology.devices
    splits = [(pipelined_step(s, p, s.mesh.judge_devices), "mesh.judge_devices")] if (
        0 < s.mesh.judge_devices < devices) else []
    best = judge_split(s, p)
    if best is not None:
        splits.append((best, "the shortest split that fits, whole hosts"))
    out = [f"pipelined step (rl.max_staleness >= 1), {why}: the judge on {x.judge} of the {devices} chips, the "
           f"policy on {devices - x.judge}: policy {x.policy_seconds:.2f} s, judge {x.judge_seconds:.2f} s, a step "
           f"{x.seconds:.2f} s against the synchronous {total:.2f} s ({total / x.seconds:.2f}x); peak "
           f"{x.policy_bytes / GiB:.2f} / {x.judge_bytes / GiB:.2f} GiB a chip{'' if x.fits else ' (does not fit)'}"
           for x, why in splits]
    if best is None:
        out.append(f"pipelined step (rl.max_staleness >= 1): no split of the {devices} chips into whole hosts fits "
                   "the policy on one side and the judge on the other")
    return out


def format_times(s, p: Plan) -> str:
    """The step-time breakdown, the rollout's tokens/s per chip and the JetStream anchor."""
    times = step_times(s, p)
    total = sum(t.seconds for t in times)
    lines = [f"{'phase (roofline)':<30} {'seconds':>10}  {'bound':<12} detail", "-" * 110]
    lines += [f"{t.name:<30} {t.seconds:>10.2f}  {t.bound:<12} {t.detail}" for t in times]
    lines.append(f"{'step':<30} {total:>10.2f}")
    if p.topology.slices > 1:
        lines.append(dcn_line(p, times))
    if "grm" in p.layouts:
        w = judge_work(s, s.reward.judge_load(s), s.rollout.prompts_per_step)
        flat = sum(t.seconds for t in step_times(with_judge(s, continuous=False), p, tree=False))
        lines.append(f"judge a step: {w.questions:,} questions, {w.prefill_tokens:,} prefill tokens with the prefix "
                     f"tree ({w.flat_prefill_tokens:,} with every vote prefilled on its own: a step of {flat:.2f} s), "
                     f"up to {w.decode_tokens:,} decode tokens")
        judge = sum(t.seconds for t in times if t.name.startswith("judge"))
        lines.append(f"judge chips to keep pace: {judge_chips(times, p.topology.devices)} chips of this kind for the "
                     f"judge alone (its {judge:.1f} s of this step on {p.topology.devices} chips, against "
                     f"{total - judge:.1f} s of the policy's phases; served on chips of its own, steps overlapped)")
        lines += lever_lines(s, p)
        lines += pipelined_lines(s, p, times)
        if w.early_questions < w.questions:
            lines.append(f"early-stopped voting (reward.judge.early_stop): {w.early_questions:,} to {w.questions:,} "
                         f"questions and up to {w.early_questions * s.judge.max_new_tokens:,} to "
                         f"{w.decode_tokens:,} decode tokens (every pair decided by its first round, or none)")
    got = jetstream_prediction()
    lines.append(f"rollout: {decode_tokens_per_s(s, p, times):,.0f} tokens/s a chip; anchor: JetStream's "
                 f"Llama-3-8B bf16 v5e-8 batch 128 (1,024 in / out) predicted {got:,.0f} tokens/s, published "
                 f"{JETSTREAM['tokens_per_s']:,.0f} (ratio {got / JETSTREAM['tokens_per_s']:.2f})")
    return "\n".join(lines)
