"""The memory of one GRPO step per device (docs/planner.md): the resident parameters and optimizer state plus the
largest of the phases (rollout, reward, log-prob, backward, update, sync), each a list of `Row`s, for a config on a
topology and mesh (`plan`)."""

from __future__ import annotations

import dataclasses

from rrc_jax import sharding
from rrc_jax.inference.kernels import PREFILL_CHUNK
from rrc_jax.constructions.base import JudgeLoad
from rrc_jax.models.attention import TRAINING_ATTENTION_BLOCK
from rrc_jax.models.attention import TRAINING_ATTENTION_BLOCK as block
from rrc_jax.models.batches import bucket_length, length_bucket, round_up
from rrc_jax.models.kv_cache import ATTENTION_BLOCK, SHARED_ATTENTION_BLOCK, ring_size
from rrc_jax.plan.hardware import HEADROOM, GiB, Topology, slice_meshes, split_size, topology
from rrc_jax.plan.judge_work import CHAT_FORMAT_TOKENS, judge_work, template_tokens
from rrc_jax.plan.shapes import (
    itemsize,
    lora_param_bytes,
    model_config,
    param_bytes,
    param_count,
    param_shapes,
    shard_size,
    weight_bytes,
)

LOGPROB_CHUNK_ARRAYS = 4  # float32 [rows, chunk, vocab] arrays live at once in a log-prob chunk (see above)


PHASES = ("resident", "rollout", "reward", "log-prob", "backward", "update", "sync")


def _rows_per_device(rows: int, mesh_shape: tuple[int, int, int]) -> int:
    """Rows of a batch on one device: over data x fsdp, rounded up (XLA pads a split that does not divide)."""
    return -(-rows // (mesh_shape[0] * mesh_shape[1]))


def _prefixes_per_device(prefixes: int, mesh_shape: tuple[int, int, int]) -> int:
    """Shared prefixes of a branched cache on one device: P over data x fsdp when that divides P, else all P
    (`sharding.constrain`, which `KVCache.branch` applies, does not shard an axis its mesh axes do not divide)."""
    n = mesh_shape[0] * mesh_shape[1]
    return prefixes // n if prefixes % n == 0 else prefixes


def kv_cache_bytes(cfg, rows: int, slots: int, mesh_shape: tuple[int, int, int], dtype: str, *,
                   shared: bool = False) -> int:
    """Bytes per device of a KV cache of `rows` rows and `slots` slots in `dtype`: per layer, keys and values
    `[rows, kv_heads, head_dim, slots]` / `[rows, kv_heads, slots, head_dim]` (rows over data x fsdp, kv heads over
    tensor when it divides them), plus the per-row slot mask `[rows, slots]` (bool), next-token logits
    `[rows, vocab]` (float32) and positions.
    `shared`: the shared prefixes of a branched cache (`KVCache.branch`), `rows` = P prefixes of `slots` = N slots:
    per layer `shared_k [P, kv_heads, head_dim, N]`, `shared_v [P, kv_heads, N, head_dim]`, and `shared_mask
    [P, N]`; no logits or positions (the branched rows hold those). P is over data x fsdp when it divides P, else
    whole (`_prefixes_per_device`). A rows' cache longer than the sliding window keeps the sliding layers' window
    only (`KVCache.ring`: `layer_slots`), with the positions its slots hold `[rows, window]` (int32); the shared
    prefixes keep every slot of every layer."""
    kv = split_size(cfg.num_kv_heads, mesh_shape[2])
    per_slot = 2 * kv * cfg.head_dim * itemsize(cfg.kv_dtype or dtype)  # one token's keys and values in one layer
    if shared:
        return _prefixes_per_device(rows, mesh_shape) * (cfg.num_layers * slots * per_slot + slots)
    ring = ring_size(cfg.sliding, cfg.sliding_window or 0, slots) or 0
    r = _rows_per_device(rows, mesh_shape)
    return r * (layer_slots(cfg, slots) * per_slot + slots + 4 * ring + 4 * cfg.vocab_size + 4)


def layer_slots(cfg, slots: float) -> float:
    """Cache slots summed over the layers when a row's cache has `slots` slots (or, in `decode_time`, tokens): a
    sliding layer keeps at most its window (`KVCache.ring`), a full one all of them."""
    window = cfg.sliding_window or 0
    return sum(min(slots, window) if local else slots for local in cfg.sliding)


def branched_cache_bytes(cfg, prefixes: int, prefix_slots: int, group: int, own: int,
                         mesh_shape: tuple[int, int, int], dtype: str) -> int:
    """Bytes per device of the caches of a `branch(group, own)` of a P-row cache of N = `prefix_slots` slots,
    through its extension and decode: the P shared prefixes (read, never copied) plus the P x group rows' own
    slots, once (`extend` and `decode` take the cache donated and update it in place); while branching, also the
    P-row cache branched from (as large as the prefixes)."""
    shared = kv_cache_bytes(cfg, prefixes, prefix_slots, mesh_shape, dtype, shared=True)
    rows = kv_cache_bytes(cfg, prefixes * group, own, mesh_shape, dtype)
    return 2 * shared + rows


def _attention_residual_bytes(cfg, hq: int, keys: int, dtype: str) -> int:
    """Per token, what one layer's attention over `keys` keys keeps for the backward pass: dense up to
    `TRAINING_ATTENTION_BLOCK` keys (masked scores, exp, mask, probabilities `[hq, keys]`), else
    `blockwise_attention`'s (docs/planner.md): the block-split mask and n + 1 float32 carries for n blocks."""
    if keys <= block:
        return (4 + 4 + 1 + itemsize(dtype)) * hq * keys
    n = -(-keys // block)
    return n * block + (n + 1) * 4 * hq * (cfg.head_dim + 2)


def layer_activation_bytes(cfg, rows: int, length: int, mesh_shape: tuple[int, int, int], dtype: str, *,
                           keys: int | None = None) -> int:
    """Bytes per device of one decoder layer's internals for `rows` sequences of `length` tokens in compute `dtype`
    (docs/planner.md: norms, rotary, q / k / v, attention, SwiGLU). Without `keys`, what the backward pass of a
    training forward keeps (attention over `length` keys: dense or blockwise); with `keys`, dense scores over that
    many keys at once, what a forward pass without gradients holds while it runs the layer."""
    tensor = mesh_shape[2]
    c, e, d = itemsize(dtype), cfg.hidden_size, cfg.head_dim
    kv = split_size(cfg.num_kv_heads, tensor)
    hq = kv * (cfg.num_heads // cfg.num_kv_heads)
    i = split_size(cfg.intermediate_size, tensor)
    attention = ((4 + 4 + 1 + c) * hq * keys if keys                # masked scores, exp (float32), mask, probs
                 else _attention_residual_bytes(cfg, hq, length, dtype))
    per_token = (2 * (4 + 2 * c) * e                        # two RMSNorms: float32 input, normed and scaled outputs
                 + 2 * c * d                                # rotary cos, sin
                 + c * (hq + 2 * kv) * d                    # q, k, v after the rotary embedding
                 + attention
                 + c * hq * d                               # attention output (input of o)
                 + 6 * c * i)                               # SwiGLU: gate, up, silu's three, their product
    return _rows_per_device(rows, mesh_shape) * length * per_token


def activation_bytes(cfg, rows: int, length: int, mesh_shape: tuple[int, int, int], dtype: str, *,
                     remat: bool = False) -> int:
    """Bytes per device of the activations the learner's backward pass keeps for `rows` sequences of `length`
    tokens: per layer, its input residual and (without `remat`) the products the scan saves
    (`rrc_jax.models.block.SAVED_RESIDUALS`: q/k/v, the attention output, the residual after attention, gate/up),
    plus one layer's internals (`layer_activation_bytes`), which the backward pass recomputes a layer at a time;
    then the final norm, the hidden states the log-prob chunks read and the loss's per-token terms. With
    `blockwise_attention` (over `TRAINING_ATTENTION_BLOCK` keys), also the block of one layer that the backward
    pass recomputes at a time: its dense internals (masked scores, exp, mask, probabilities `[heads, block]` a
    token)."""
    c, e, d = itemsize(dtype), cfg.hidden_size, cfg.head_dim
    tokens = _rows_per_device(rows, mesh_shape) * length
    kv = split_size(cfg.num_kv_heads, mesh_shape[2])
    hq = kv * (cfg.num_heads // cfg.num_kv_heads)
    saved = e if remat else (e + (hq + 2 * kv) * d + hq * d + e + 2 * split_size(cfg.intermediate_size, mesh_shape[2]))
    layers = cfg.num_layers * c * saved * tokens + layer_activation_bytes(cfg, rows, length, mesh_shape, dtype)
    recompute = tokens * (4 + 4 + 1 + c) * hq * block if length > block else 0
    return layers + recompute + tokens * ((4 + 2 * c) * e + c * e + 8 * 4)


def logprob_chunk_bytes(cfg, rows: int, chunk: int, mesh_shape: tuple[int, int, int]) -> int:
    """Bytes per device of one log-prob chunk: `LOGPROB_CHUNK_ARRAYS` float32 `[rows, chunk, vocab]` (rows over
    data x fsdp, vocab over tensor when it divides it)."""
    return LOGPROB_CHUNK_ARRAYS * _rows_per_device(rows, mesh_shape) * chunk * split_size(cfg.vocab_size,
                                                                                       mesh_shape[2]) * 4


def forward_bytes(cfg, rows: int, length: int, mesh_shape: tuple[int, int, int], dtype: str, *,
                  keys: int | None = None) -> int:
    """Bytes per device of a forward pass without gradients (prefill, log-probs, DRM scores) over `rows` x
    `length` new tokens attending to `keys` positions at once (default: a no-cache forward's, `length` keys in
    blocks of `TRAINING_ATTENTION_BLOCK`): the residual stream in and out of a layer plus one layer's internals."""
    stream = 2 * _rows_per_device(rows, mesh_shape) * length * cfg.hidden_size * itemsize(dtype)
    keys = keys or min(length, TRAINING_ATTENTION_BLOCK)
    return stream + layer_activation_bytes(cfg, rows, length, mesh_shape, dtype, keys=keys)


def shared_block(prefix_slots: int) -> int:
    """Prefix slots that `shared_attention` scores at once: `SHARED_ATTENTION_BLOCK` when it splits the N prefix
    slots into several whole blocks (a `lax.scan`), else N (one pass)."""
    block = SHARED_ATTENTION_BLOCK
    return block if prefix_slots > block and prefix_slots % block == 0 else prefix_slots


def decode_step_bytes(cfg, rows: int, prefix_slots: int, mesh_shape: tuple[int, int, int]) -> int:
    """Bytes per device of a decode step's attention over a branched cache's shared prefixes of `prefix_slots`
    = N slots: masked scores and their exponentials, float32 `[P, K, M, G, 1, N_j]` for the P x M = `rows` rows,
    i.e. `[rows, heads, N_j]`: each row group reads only its own prefix, a block of `shared_block(N)` slots at a
    time (`shared_attention`); the own slots are read a cache block at a time."""
    kv = split_size(cfg.num_kv_heads, mesh_shape[2])
    hq = kv * (cfg.num_heads // cfg.num_kv_heads)
    return 2 * 4 * _rows_per_device(rows, mesh_shape) * hq * shared_block(prefix_slots)


def gathered_bytes(cfg, dtype: str, mesh_shape: tuple[int, int, int], *, lm_head_only: bool = False) -> int:
    """Bytes per device of weights all-gathered over fsdp (still split over tensor) that a pass holds at once, in
    `dtype`: one layer's (the layers run under a scan, which gathers each layer's weights in its turn) and the LM
    head (the embedding when tied), or the LM head alone. XLA hoists the LM head's loop-invariant all-gather out of
    a loop (decode's while loop, the micro-batch scan, the log-prob chunks' map), so it stays gathered through it.
    0 without fsdp."""
    data, fsdp, tensor = mesh_shape
    if fsdp == 1:
        return 0
    head = cfg.hidden_size * split_size(cfg.vocab_size, tensor) * itemsize(dtype)
    return head if lm_head_only else head + layer_param_bytes(cfg, dtype, (1, 1, tensor))


def layer_param_bytes(cfg, dtype: str, mesh_shape: tuple[int, int, int], layout: str = "train") -> int:
    """Bytes per device of one decoder layer's parameters in `dtype` on a mesh in `layout` (a layer's slice of the
    stacked parameters, which the scan reads in its turn; the layers axis is never split)."""
    stacked = sum(shard_size(shape, names, mesh_shape, layout)
                  for path, (shape, names) in param_shapes(cfg).items() if path[0] == "layers")
    return stacked // cfg.num_layers * itemsize(dtype)


def sync_transient_bytes(cfg, dtype: str) -> int:
    """Bytes per device that the rollout copy's sync (`RolloutCopy`) holds besides the copy: XLA reshards a tensor
    between the two layouts' meshes through a replicated copy of it, and the sync moves the stacked layers one layer
    at a time, the embedding and the LM head whole (in `dtype`, the copy's)."""
    layer = layer_param_bytes(cfg, dtype, (1, 1, 1))
    return max(layer, param_bytes(cfg, dtype, (1, 1, 1)) - cfg.num_layers * layer)


def gather_traffic_bytes(cfg, dtype: str, mesh_shape: tuple[int, int, int]) -> int:
    """Bytes per device that one pass of the training layout all-gathers over fsdp: every weight once (each layer's
    in its turn). 0 without fsdp."""
    return param_bytes(cfg, dtype, (1, 1, mesh_shape[2])) if mesh_shape[1] > 1 else 0


@dataclasses.dataclass(frozen=True)
class Row:
    """One component: bytes per device, the phase it lives in (`PHASES`), and how it was counted."""

    name: str
    phase: str
    bytes: int
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Plan:
    """Per-device memory of a run on a topology, mesh, micro-batch size and remat setting (docs/planner.md).
    `problems` make the mesh unusable (the run would not start); `notes` qualify the figures."""

    topology: Topology
    mesh: tuple[int, int, int]
    micro_batch: int
    remat: bool
    rows: tuple[Row, ...]
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    layouts: dict = dataclasses.field(default_factory=dict)  # role (and `rollout`) -> (layout, mesh shape)
    dcn: tuple[int, int, int] = (1, 1, 1)  # the mesh's sizes across slices (`mesh.dcn`), a factor of `mesh`'s

    def phase_bytes(self, phase: str) -> int:
        return sum(r.bytes for r in self.rows if r.phase == phase)

    @property
    def largest_phase(self) -> str:
        return max(PHASES[1:], key=self.phase_bytes)

    @property
    def peak_bytes(self) -> int:
        """The resident part plus the largest phase."""
        return self.phase_bytes("resident") + self.phase_bytes(self.largest_phase)

    @property
    def budget_bytes(self) -> int:
        return int(self.topology.hbm_bytes * HEADROOM)

    @property
    def fits(self) -> bool:
        return not self.problems and self.peak_bytes <= self.budget_bytes


def roles(s) -> dict[str, str]:
    """The roles a run loads -> their model names: the policy, the reference for the KL (`rl.beta > 0`) and
    whatever the reward construction declares (`Construction.roles`); under LoRA the reference is the policy's own
    base (`rrc_jax.rl.roles.Roles.shares_base`), not a model of its own, unless `models.reference` names one."""
    m, needs = s.models, s.reward_roles
    out = {"policy": m.policy}
    shares = s.lora.enabled and not m.reference  # LoRA: the policy's base with its initial adapters
    if (s.grpo.beta > 0 or "reference" in needs) and not shares:
        out["reference"] = m.reference or m.policy
    out.update({role: getattr(m, role) for role in ("grm", "drm") if role in needs})
    return out


def _policy_rollouts(s, cfg, shape, dtype, layout: str) -> list[Row]:
    """The rollout phase on mesh `shape` in `layout`: the policy sampler's caches (a step's groups or the held-out
    greedy generation, the larger), its transients and, sampling from the training layout, the weights its decode
    loop gathers."""
    rl = s.rollout
    n_new = rl.max_new_tokens
    prompt = min(bucket_length(s.prompts.data.max_prompt_tokens), cfg.max_position_embeddings - n_new)
    max_batch = rl.max_batch
    prompts = min(rl.prompts_per_step, max(1, max_batch // rl.group_size))  # per sampler call
    rows, own = prompts * rl.group_size, round_up(n_new, ATTENTION_BLOCK)
    group = branched_cache_bytes(cfg, prompts, prompt, rl.group_size, own, shape, dtype)
    eval_rows, eval_slots = min(s.prompts.data.eval_prompts, max_batch), round_up(prompt + n_new,
                                                                                       ATTENTION_BLOCK)
    greedy = kv_cache_bytes(cfg, eval_rows, eval_slots, shape, dtype)  # decoded in place (donated)
    if group >= greedy:
        out = [Row("rollout KV cache", "rollout", group, f"{rows} rows x {own} slots + {prompts} shared prefixes "
                                                          f"x {prompt} slots (x2 while branching)")]
    else:
        out = [Row("rollout KV cache", "rollout", greedy, f"eval: {eval_rows} rows x {eval_slots} slots")]
    chunk = min(prompt, PREFILL_CHUNK)  # chunked prefill
    transient = max(forward_bytes(cfg, prompts, chunk, shape, dtype, keys=ATTENTION_BLOCK),
                    forward_bytes(cfg, eval_rows, chunk, shape, dtype, keys=ATTENTION_BLOCK),
                    decode_step_bytes(cfg, rows, prompt, shape))
    out.append(Row("prefill / decode transients", "rollout", transient, "one layer"))
    if layout == "train":
        out.append(Row("gathered policy weights", "rollout", gathered_bytes(cfg, "float32", shape),
                       "one layer at a time, and the LM head"))
    return out


def tree_cache_bytes(cfg, levels: list[tuple[int, int]], rows: int, own: int, mesh_shape: tuple[int, int, int],
                     dtype: str) -> int:
    """Bytes per device of the caches of a judge chunk read as a prefix tree (`rrc_jax.inference.question_tree`)
    through its extensions and decode: every shared level (`levels`: (prefixes, slots) each, read, never copied),
    the `rows` rows' own slots, once (donated), and while branching the cache branched from again (as large as
    the largest level)."""
    shared = [kv_cache_bytes(cfg, n, slots, mesh_shape, dtype, shared=True) for n, slots in levels]
    return sum(shared) + max(shared) + kv_cache_bytes(cfg, rows, own, mesh_shape, dtype)


def _judging(s, cfg, shape, dtype, layout: str) -> tuple[list[Row], str]:
    """The reward phase of a judge reward on mesh `shape` in `layout`: the call (a step's questions or the judged
    evaluation's) whose caches and transients are the larger; and a note on the estimated question lengths."""
    judge, n_new, max_prompt = s.judge, s.rollout.max_new_tokens, s.prompts.data.max_prompt_tokens
    load = s.reward.judge_load(s)
    best: list[Row] = []
    votes = s.eval.judge_votes
    for call, calls in ((s.reward_kind, (load, s.rollout.prompts_per_step)),
                        ("eval", (JudgeLoad(votes, 0, min(votes, 2), min(votes, 2)), s.prompts.data.eval_prompts))):
        if not calls[0].questions or not calls[1]:
            continue
        work = judge_work(s, *calls)
        p, f, m, c = work.chunk
        leaves = p * f * m
        levels = [(p, work.prefix)] + ([(p * f, work.first)] if work.first else [])
        own = round_up((0 if c > 1 else work.rest) + judge.max_new_tokens, ATTENTION_BLOCK)
        if c > 1:  # the whole questions are a level too, their votes its rows
            levels.append((leaves, work.rest))
        shared = sum(slots for _, slots in levels)
        out = [Row("judge KV cache", "reward", tree_cache_bytes(cfg, levels, work.rows, own, shape, dtype),
                   f"{call}: {p} prefixes x {f} firsts x {m} questions x {c} votes = {work.rows} rows x {own} slots "
                   f"+ shared levels of {' + '.join(f'{n} x {slots}' for n, slots in levels)} slots (the largest "
                   "x2 while branching)"),
               Row("judge prefill transients", "reward",
                   max(forward_bytes(cfg, p, min(work.prefix, PREFILL_CHUNK), shape, dtype, keys=ATTENTION_BLOCK),
                       forward_bytes(cfg, leaves, min(work.rest, PREFILL_CHUNK), shape, dtype,
                                     keys=shared_block(work.prefix) + ATTENTION_BLOCK),
                       decode_step_bytes(cfg, work.rows, shared, shape)),
                   f"one layer; {work.rest} question tokens in chunks of {min(work.rest, PREFILL_CHUNK)} attend to "
                   f"their prefix's {work.prefix} slots, {shared_block(work.prefix)} at a time")]
        if layout == "train":
            out.append(Row("gathered GRM weights", "reward", gathered_bytes(cfg, dtype, shape),
                           "one layer at a time, and the LM head"))
        if sum(x.bytes for x in out) > sum(x.bytes for x in best):
            best = out
    pre, head, tail = template_tokens(s)
    note = (f"judge questions estimated at {max_prompt} + {pre} prefix tokens (prompt + template), {n_new} + {head} "
            f"tokens to the end of the first response, {n_new} + {tail} after it, {judge.max_new_tokens} new tokens; "
            f"{load.questions} questions ({load.leaves} different) and up to {load.tokens} judge tokens per prompt of "
            "a step")
    return best, note


def inference_shape(s, topo: Topology, num_heads: int) -> tuple[int, int, int]:
    """The inference layout's mesh `(data, fsdp, tensor)` (`mesh.inference`: `auto`, as
    `rrc_jax.sharding.inference_mesh` makes it, or DATA,FSDP,TENSOR)."""
    if s.mesh.inference == "auto":
        t = sharding.inference_tensor(topo.devices, topo.host_devices, num_heads)
        return topo.devices // t, 1, t
    return sharding.inference_shape(s.mesh.inference, topo.devices)


def role_layouts(s, topo: Topology, shape: tuple[int, int, int], cfgs: dict) -> dict:
    """Each role's (layout, mesh shape), as `MeshConfig.layout` places it: the policy's master in the training
    layout on `shape`; the reference, GRM and DRM in their `mesh.<role>` layout; `rollout`, the policy's rollout
    copy in the inference layout, unless `rl.share_weights` or one device."""
    out = {}
    for role, cfg in cfgs.items():
        name = s.mesh.layout_name(role, topo.devices)
        out[role] = (name, shape if name == "train" else inference_shape(s, topo, cfg.num_heads))
    if topo.devices > 1 and not s.rollout.share_weights:
        out["rollout"] = ("inference", inference_shape(s, topo, cfgs["policy"].num_heads))
    return out


def plan(s, topo: Topology | str, *, mesh: tuple[int, int, int] | None = None,
         micro_batch_size: int | None = None, remat: bool | None = None,
         dcn: tuple[int, int, int] | None = None) -> Plan:
    """The memory `Plan` of a trainer's settings `s` (`rrc_jax.config.TrainerSettings`) on `topo` (a `Topology` or
    its name), on the settings' mesh (on several slices `mesh.dcn` across them, `slice_meshes`),
    `rl.micro_batch_size` and `rl.remat` unless `mesh` (the whole mesh, with `dcn` its sizes across slices),
    `micro_batch_size` or `remat` are given. With `rl.remat` unset and no `remat`, the plan chooses: without remat
    unless only remat fits (recomputing the forward pass costs a third more of the update's FLOPs;
    benchmarks/README.md)."""
    topo = topology(topo) if isinstance(topo, str) else topo
    if remat is None and s.learner.remat is None:
        off = plan(s, topo, mesh=mesh, micro_batch_size=micro_batch_size, remat=False, dcn=dcn)
        if off.fits or off.problems:
            return off
        on = plan(s, topo, mesh=mesh, micro_batch_size=micro_batch_size, remat=True, dcn=dcn)
        return on if on.fits else off
    rl, learner, dtype, max_prompt = s.rollout, s.learner, s.models.dtype, s.prompts.data.max_prompt_tokens
    if mesh is None:
        mesh, dcn = slice_meshes(s.mesh, topo)
    shape, dcn = mesh, dcn or (1, 1, 1)
    data, fsdp, tensor = shape
    micro = learner.micro_batch_size if micro_batch_size is None else micro_batch_size
    remat = learner.remat if remat is None else remat
    rows, notes, problems = [], [], []

    field = lambda role: "models.policy" if role == "reference" and not s.models.reference else f"models.{role}"
    cfgs = {role: model_config(name, field=field(role), value_head=role == "drm")
            for role, name in roles(s).items()}
    policy = cfgs["policy"]
    layouts = role_layouts(s, topo, shape, cfgs)
    lora = s.lora
    if lora.enabled:
        lora.check_rank(policy, s.models.policy)
    size = lambda n: f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"
    for role, cfg in cfgs.items():
        stored = "float32" if role == "policy" else dtype
        layout, where = layouts[role]
        n = param_count(cfg)
        placed = f"{layout} layout" + ("" if layout == "train" else f" (data={where[0]} tensor={where[2]})")
        if role == "policy" and lora.enabled:  # a frozen base in `dtype` (or quantized), float32 adapters
            base, adapters, count = lora_param_bytes(cfg, lora, dtype, where, layout)
            rows.append(Row("policy base (frozen)", "resident", base,
                            f"{size(n)} {lora.weight_qtype or dtype}, {placed}"))
            rows.append(Row("policy LoRA adapters", "resident", adapters,
                            f"{size(count)} float32, rank {lora.rank} on {lora.targets}"))
            continue
        qtype = s.judge.weight_qtype if role == "grm" else ""  # a judge stored quantized (reward.judge.weight_qtype)
        rows.append(Row(f"{role} parameters", "resident", weight_bytes(cfg, stored, where, layout, qtype),
                        f"{size(n)} {qtype or stored}, {placed}"))
        if cfg.num_kv_heads % where[2]:
            notes.append(f"{role}: tensor={where[2]} does not divide its {cfg.num_kv_heads} kv heads: they are "
                         "replicated over tensor (their weights, KV caches and attention)")
    if lora.enabled and not s.models.reference and (s.grpo.beta > 0 or "reference" in s.reward_roles):
        notes.append("reference: the policy's frozen base with its initial adapters (LoRA): no second copy")
    if "rollout" in layouts:
        layout, where = layouts["rollout"]
        if lora.enabled:
            base, adapters, _ = lora_param_bytes(policy, lora, dtype, where, layout)
            rows.append(Row("policy rollout copy", "resident", base + adapters,
                            f"{lora.weight_qtype or dtype} base + float32 adapters, inference layout (data={where[0]} "
                            f"tensor={where[2]}); each update syncs the adapters only"))
            merged = param_bytes(policy, dtype, where, layout)
            notes.append(f"weight sync: the adapters only, {adapters / 2**20:.1f} MiB per device per update, against "
                         f"{merged / GiB:.2f} GiB to merge them into a {dtype} copy of the base (every weight "
                         "rewritten): adapters")
        else:
            rows.append(Row("policy rollout copy", "resident", param_bytes(policy, dtype, where, layout),
                            f"{dtype}, inference layout (data={where[0]} tensor={where[2]}), resharded after each "
                            "update"))
    p32 = rows[1].bytes if lora.enabled else rows[0].bytes  # what the learner trains (float32): under LoRA the adapters
    rows.append(Row("optimizer state (AdamW)", "resident", 2 * p32,
                    "2 float32 moments" + (" of the adapters" if lora.enabled else "")))
    batch = rl.prompts_per_step * rl.group_size
    if batch % (data * fsdp):
        problems.append(f"a step's {batch} rollouts are not divisible by data x fsdp = {data * fsdp} (batches are "
                        "sharded evenly)")
    if problems:  # the run would not start: no phases
        return Plan(topo, shape, micro, remat, tuple(rows), tuple(notes), tuple(problems), layouts, dcn)

    rows += _policy_rollouts(s, policy, layouts.get("rollout", layouts["policy"])[1], dtype,
                             layouts.get("rollout", layouts["policy"])[0])
    if rl.dynamic_sampling:
        notes.append(f"dynamic sampling: a step draws 1 to rl.max_draws = {rl.max_draws} batches of prompts until "
                     "its groups' rewards differ; rollout and judging below are one draw's")
    if "grm" in cfgs:
        judged, note = _judging(s, cfgs["grm"].replace(kv_dtype=s.judge.kv_dtype), layouts["grm"][1], dtype,
                                layouts["grm"][0])
        rows += judged
        notes.append(note)
    if "drm" in cfgs:
        length = length_bucket(max_prompt + rl.max_new_tokens + CHAT_FORMAT_TOKENS)
        drm_batch = s.constructions["drm"].max_batch
        rows.append(Row("DRM forward", "reward", forward_bytes(cfgs["drm"], drm_batch, length, layouts["drm"][1],
                                                               dtype),
                        f"{drm_batch} rows x {length} tokens, one layer"))

    length = bucket_length(max_prompt + rl.max_new_tokens)
    lp_rows = micro or batch
    scored = [policy] + ([cfgs.get("reference", policy)] if s.grpo.beta > 0 else [])
    rows.append(Row("log-prob pass", "log-prob", max(forward_bytes(c, lp_rows, length, shape, dtype)
                                                      + logprob_chunk_bytes(c, lp_rows, learner.logprob_chunk, shape)
                                                      for c in scored),
                    f"{lp_rows} rows x {length} tokens, one layer + chunk, no gradients"))
    weights = dtype if lora.enabled else "float32"  # the policy's stored weights: a LoRA base is in `dtype`
    rows.append(Row("gathered LM head", "log-prob", gathered_bytes(policy, weights, shape, lm_head_only=True),
                    "hoisted out of the chunk loop"))

    learn_rows = micro or learner.minibatch_size
    accumulating = learn_rows < learner.minibatch_size
    rows.append(Row("activations", "backward", activation_bytes(policy, learn_rows, length, shape, dtype,
                                                                remat=remat),
                    f"{learn_rows} rows x {length} tokens{', remat' if remat else ''}"))
    rows.append(Row("log-prob chunk", "backward", logprob_chunk_bytes(policy, learn_rows, learner.logprob_chunk, shape),
                    f"{LOGPROB_CHUNK_ARRAYS} x [{learn_rows}, {learner.logprob_chunk}, {policy.vocab_size}] float32"))
    hoisted = shape if not accumulating else (data, 1, tensor)  # the micro-batch scan keeps weights gathered
    if accumulating:
        rows.append(Row("gradient accumulator", "backward", p32, "float32"))
        rows.append(Row("gathered policy weights", "backward", gathered_bytes(policy, weights, shape),
                        "one layer at a time, and the LM head"))
    else:
        rows.append(Row("gathered LM head", "backward", gathered_bytes(policy, weights, shape, lm_head_only=True),
                        "hoisted out of the chunk loop"))
    if lora.weight_qtype:
        rows.append(Row("dequantized layer", "backward", layer_param_bytes(policy, dtype, hoisted),
                        f"one layer's {lora.weight_qtype} weights in {dtype}, as the scan multiplies by them"))
    elif dtype != "float32" and not lora.enabled:
        rows.append(Row(f"{dtype} weight copy", "backward", param_bytes(policy, dtype, hoisted),
                        "the policy's weights as the backward pass multiplies by them"))
    rows.append(Row("gradients", "update", p32 * (2 if accumulating else 1),
                    "float32 + accumulator" if accumulating else "float32"))
    if "rollout" in layouts:
        rows.append(Row("weight sync transient", "sync", p32 if lora.enabled else sync_transient_bytes(policy, dtype),
                        "the adapters" if lora.enabled else
                        "one layer, or the embedding and LM head, replicated while resharded"))
    if learn_rows % (data * fsdp):
        notes.append(f"micro-batch of {learn_rows} rows over data x fsdp = {data * fsdp}: "
                     f"{_rows_per_device(learn_rows, shape)} per device, padded")
    rows = [r for r in rows if r.bytes or r.phase == "resident"]  # e.g. no gathered weights without fsdp
    return Plan(topo, shape, micro, remat, tuple(rows), tuple(notes), tuple(problems), layouts, dcn)
