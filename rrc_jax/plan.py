"""Memory planner: will a GRPO run of a trainer config fit a TPU slice or GPU host, and on which mesh?

    python -m rrc_jax.plan --config=agr.py --topology=v5e-64 [--config.models.policy=llama3-8b
        --config.models.grm=llama3-8b --config.mesh.fsdp=... --config.rl.micro_batch_size=...]

prints, per device, what the run holds in high-bandwidth memory, whether it fits, and, when it does not, a mesh and
micro-batch size that do. Nothing is loaded or compiled: the figures are arithmetic on the model shapes
(`DecoderConfig`: a size preset such as `llama3-8b`, a Hugging Face directory's `config.json`, or `toy`) and the
config. `tests/test_plan.py` checks them against XLA's own accounting of the compiled learner update and decode
step on an 8-device CPU mesh.

The model of memory (a resident part plus the largest of five phases; what each row counts, and the check against
XLA) is in docs/planner.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from pathlib import Path

from rrc_jax.errors import ConfigError
from rrc_jax.models import families
from rrc_jax.models.kv_cache import ring_size
from rrc_jax.models.lora import LoraConfig
from rrc_jax.settings import parse

GiB = 1 << 30
HEADROOM = 0.9  # the share of HBM a plan may use: XLA's scratch, fragmentation and collectives take the rest

# Per device of each accelerator family (a chip; v4 and v5p name TensorCores, 2 per chip, one JAX device per chip):
# HBM (GiB), devices per host (`host`; slices of at most 8 chips of v5e / v6e are one host of 8), and the
# roofline's peak dense bf16 FLOP/s, HBM bytes/s and interconnect bytes/s one way (Cloud TPU system architecture
# pages; NVIDIA's H100 / H200 SXM data sheets, NVLink 900 GB/s both ways).
ACCELERATORS = {
    "v4": dict(hbm=32, unit="TensorCores", per_chip=2, host=4, flops=275e12, hbm_bw=1.2e12, ici_bw=300e9),
    "v5p": dict(hbm=95, unit="TensorCores", per_chip=2, host=4, flops=459e12, hbm_bw=2.765e12, ici_bw=600e9),
    "v5e": dict(hbm=16, unit="chips", per_chip=1, host=4, flops=197e12, hbm_bw=819e9, ici_bw=200e9),
    "v5litepod": dict(hbm=16, unit="chips", per_chip=1, host=4, flops=197e12, hbm_bw=819e9, ici_bw=200e9),
    "v6e": dict(hbm=32, unit="chips", per_chip=1, host=4, flops=918e12, hbm_bw=1.64e12, ici_bw=400e9),
    "h100": dict(hbm=80, unit="GPUs", per_chip=1, host=8, flops=989e12, hbm_bw=3.35e12, ici_bw=450e9),
    "h200": dict(hbm=141, unit="GPUs", per_chip=1, host=8, flops=989e12, hbm_bw=4.8e12, ici_bw=450e9),
    # nominal, for tests (host memory is not HBM; the speeds are placeholders, not a CPU's)
    "cpu": dict(hbm=1024, unit="devices", per_chip=1, host=1 << 20, flops=1e12, hbm_bw=1e11, ici_bw=1e10),
}

# Size presets: DecoderConfig fields from the public Hugging Face config.json of each model, one family's in its
# module (`rrc_jax.models.families`).
PRESETS = families.presets()

LOGPROB_CHUNK_ARRAYS = 4  # float32 [rows, chunk, vocab] arrays live at once in a log-prob chunk (see above)
CHARS_PER_TOKEN = 4       # judge template text -> tokens (BPE on English); 1 for the toy character tokenizer
CHAT_FORMAT_TOKENS = 32   # special tokens and role headers of a chat template, per judge question
PHASES = ("resident", "rollout", "reward", "log-prob", "backward", "update", "sync")


# ------------------------------------------------------------------------------------------------------------
# Topologies and meshes
# ------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Topology:
    """A slice or host: `devices` JAX devices (TPU chips, GPUs) of `hbm_bytes` each, `host_devices` to a host; per
    device the peak dense bf16 `flops` (FLOP/s), `hbm_bw` and one-way interconnect `ici_bw` (bytes/s)."""

    name: str
    devices: int
    hbm_bytes: int
    host_devices: int = 1
    flops: float = 0.0
    hbm_bw: float = 0.0
    ici_bw: float = 0.0


def topology(name: str) -> Topology:
    """The `Topology` of a Cloud TPU name (`v4-32`, `v5p-64`: TensorCores, 2 per chip; `v5e-64`, `v5litepod-16`,
    `v6e-8`: chips), a GPU host (`h100-8`, `h200-8`) or `cpu-N` (tests). A multi-host pod is one topology: its
    devices are its chips. Anything else is a `ConfigError` naming the known forms."""
    match = re.fullmatch(r"([a-z0-9]+)-(\d+)", name.strip().lower())
    family = ACCELERATORS.get(match.group(1)) if match else None
    count = int(match.group(2)) if match else 0
    if family is None or count < family["per_chip"] or count % family["per_chip"]:
        known = ", ".join(f"{k}-N ({v['unit']}{', 2 per chip' if v['per_chip'] == 2 else ''})"
                          for k, v in ACCELERATORS.items())
        raise ConfigError(f"--topology={name}: unknown topology; known: {known}")
    devices = count // family["per_chip"]
    host = devices if family["unit"] == "chips" and devices <= 8 else min(devices, family["host"])
    return Topology(name, devices, family["hbm"] * GiB, host, family["flops"], family["hbm_bw"], family["ici_bw"])


def resolve_mesh(data: int, fsdp: int, tensor: int, devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) with a -1 taking the remaining devices, as the trainer's mesh resolves it
    (`rrc_jax.sharding.mesh_shape`)."""
    from rrc_jax.sharding import mesh_shape

    return mesh_shape(data, fsdp, tensor, devices)


def _split(n: int, k: int) -> int:
    """The per-device share of an axis of n split k ways: n / k when k divides n, else n (left whole)."""
    return n // k if n % k == 0 else n


# ------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------

def model_config(name: str, *, field: str = "models.policy", value_head: bool = False):
    """The `DecoderConfig` of a role: a size preset (`PRESETS`), `toy` (the toy world's sizes, `TOY_MODELS`; the
    world is not built) or a Hugging Face directory (its `config.json`). `field` names the config field in errors."""
    from rrc_jax.models.decoder_config import DecoderConfig

    if name in PRESETS:
        return DecoderConfig(**PRESETS[name], value_head=value_head)
    if name == "toy":
        from rrc_jax.data.toy.task import TOY_MODELS
        from rrc_jax.data.toy.task import ALPHABET
        from rrc_jax.data.toy.world import ModelSpec, model_config as toy_config
        from rrc_jax.models.char_tokenizer import SPECIAL_TOKENS

        role = field.rsplit(".", 1)[-1]
        spec = ModelSpec(**TOY_MODELS["policy" if role == "reference" else role])
        return toy_config(spec, len(SPECIAL_TOKENS) + len(ALPHABET), value_head=value_head)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(f"config.{field}={name!r}: not a size preset (known: {', '.join(PRESETS)}), 'toy', or a "
                          "Hugging Face directory with a config.json")
    from rrc_jax.models.hf_io import read_hf_config

    return DecoderConfig.from_hf(read_hf_config(path), value_head=value_head)


def param_shapes(cfg) -> dict[tuple, tuple[tuple[int, ...], tuple[str | None, ...]]]:
    """Every parameter of `Decoder(cfg)`: its state path -> (shape, logical axis names), read from the decoder built
    abstractly (`nnx.eval_shape`: nothing allocated, so a family's own parameters count without a table here)."""
    return dict(_param_shapes(cfg))


@functools.lru_cache(maxsize=64)
def _param_shapes(cfg) -> tuple:
    from flax import nnx

    from rrc_jax.models.decoder import Decoder
    from rrc_jax.sharding import model_context

    with model_context(None):
        model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    return tuple((tuple(path), (tuple(v.shape), tuple(v.get_metadata()["out_sharding"])))
                 for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))


def param_count(cfg) -> int:
    """The number of parameters of `Decoder(cfg)`."""
    return sum(math.prod(shape) for shape, _ in param_shapes(cfg).values())


def _mesh_axes(names, shape, mesh_shape, layout: str = "train") -> list[int]:
    """Ways each axis of an array of `shape` with logical `names` is split on a `(data, fsdp, tensor)` mesh in
    `layout` (`rrc_jax.sharding.partition`: an axis its mesh axes do not divide is replicated, as JAX places it)."""
    from rrc_jax.sharding import LAYOUTS, MESH_AXES, partition

    size = dict(zip(MESH_AXES, mesh_shape))
    return [math.prod(size[a] for a in axes) for axes in partition(names, shape, LAYOUTS[layout], size)]


def param_bytes(cfg, dtype: str, mesh_shape: tuple[int, int, int], layout: str = "train") -> int:
    """Bytes per device of `Decoder(cfg)`'s parameters stored in `dtype` on a `(data, fsdp, tensor)` mesh in
    `layout` (`rrc_jax.sharding.LAYOUTS`): each parameter's shard, replicated over data (and, in the inference
    layout, over fsdp); an axis its mesh axes do not divide is whole."""
    return sum(_shard_size(shape, names, mesh_shape, layout)
               for shape, names in param_shapes(cfg).values()) * _itemsize(dtype)


def _shard_size(shape, names, mesh_shape, layout: str) -> int:
    """Elements on one device of an array of `shape` with logical `names` (`_mesh_axes`)."""
    return math.prod(n // w for n, w in zip(shape, _mesh_axes(names, shape, mesh_shape, layout)))


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2}[dtype]


# ------------------------------------------------------------------------------------------------------------
# Caches and activations
# ------------------------------------------------------------------------------------------------------------

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
    kv = _split(cfg.num_kv_heads, mesh_shape[2])
    per_slot = 2 * kv * cfg.head_dim * _itemsize(dtype)  # one token's keys and values in one layer
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
    from rrc_jax.models.attention import TRAINING_ATTENTION_BLOCK as block

    if keys <= block:
        return (4 + 4 + 1 + _itemsize(dtype)) * hq * keys
    n = -(-keys // block)
    return n * block + (n + 1) * 4 * hq * (cfg.head_dim + 2)


def layer_activation_bytes(cfg, rows: int, length: int, mesh_shape: tuple[int, int, int], dtype: str, *,
                           keys: int | None = None) -> int:
    """Bytes per device of one decoder layer's internals for `rows` sequences of `length` tokens in compute `dtype`
    (docs/planner.md: norms, rotary, q / k / v, attention, SwiGLU). Without `keys`, what the backward pass of a
    training forward keeps (attention over `length` keys: dense or blockwise); with `keys`, dense scores over that
    many keys at once, what a forward pass without gradients holds while it runs the layer."""
    tensor = mesh_shape[2]
    c, e, d = _itemsize(dtype), cfg.hidden_size, cfg.head_dim
    kv = _split(cfg.num_kv_heads, tensor)
    hq = kv * (cfg.num_heads // cfg.num_kv_heads)
    i = _split(cfg.intermediate_size, tensor)
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
    from rrc_jax.models.attention import TRAINING_ATTENTION_BLOCK as block

    c, e, d = _itemsize(dtype), cfg.hidden_size, cfg.head_dim
    tokens = _rows_per_device(rows, mesh_shape) * length
    kv = _split(cfg.num_kv_heads, mesh_shape[2])
    hq = kv * (cfg.num_heads // cfg.num_kv_heads)
    saved = e if remat else (e + (hq + 2 * kv) * d + hq * d + e + 2 * _split(cfg.intermediate_size, mesh_shape[2]))
    layers = cfg.num_layers * c * saved * tokens + layer_activation_bytes(cfg, rows, length, mesh_shape, dtype)
    recompute = tokens * (4 + 4 + 1 + c) * hq * block if length > block else 0
    return layers + recompute + tokens * ((4 + 2 * c) * e + c * e + 8 * 4)


def logprob_chunk_bytes(cfg, rows: int, chunk: int, mesh_shape: tuple[int, int, int]) -> int:
    """Bytes per device of one log-prob chunk: `LOGPROB_CHUNK_ARRAYS` float32 `[rows, chunk, vocab]` (rows over
    data x fsdp, vocab over tensor when it divides it)."""
    return LOGPROB_CHUNK_ARRAYS * _rows_per_device(rows, mesh_shape) * chunk * _split(cfg.vocab_size,
                                                                                       mesh_shape[2]) * 4


def forward_bytes(cfg, rows: int, length: int, mesh_shape: tuple[int, int, int], dtype: str, *,
                  keys: int | None = None) -> int:
    """Bytes per device of a forward pass without gradients (prefill, log-probs, DRM scores) over `rows` x
    `length` new tokens attending to `keys` positions at once (default: a no-cache forward's, `length` keys in
    blocks of `TRAINING_ATTENTION_BLOCK`): the residual stream in and out of a layer plus one layer's internals."""
    from rrc_jax.models.attention import TRAINING_ATTENTION_BLOCK

    stream = 2 * _rows_per_device(rows, mesh_shape) * length * cfg.hidden_size * _itemsize(dtype)
    keys = keys or min(length, TRAINING_ATTENTION_BLOCK)
    return stream + layer_activation_bytes(cfg, rows, length, mesh_shape, dtype, keys=keys)


def shared_block(prefix_slots: int) -> int:
    """Prefix slots that `shared_attention` scores at once: `SHARED_ATTENTION_BLOCK` when it splits the N prefix
    slots into several whole blocks (a `lax.scan`), else N (one pass)."""
    from rrc_jax.models.kv_cache import SHARED_ATTENTION_BLOCK as block

    return block if prefix_slots > block and prefix_slots % block == 0 else prefix_slots


def decode_step_bytes(cfg, rows: int, prefix_slots: int, mesh_shape: tuple[int, int, int]) -> int:
    """Bytes per device of a decode step's attention over a branched cache's shared prefixes of `prefix_slots`
    = N slots: masked scores and their exponentials, float32 `[P, K, M, G, 1, N_j]` for the P x M = `rows` rows,
    i.e. `[rows, heads, N_j]`: each row group reads only its own prefix, a block of `shared_block(N)` slots at a
    time (`shared_attention`); the own slots are read a cache block at a time."""
    kv = _split(cfg.num_kv_heads, mesh_shape[2])
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
    head = cfg.hidden_size * _split(cfg.vocab_size, tensor) * _itemsize(dtype)
    return head if lm_head_only else head + layer_param_bytes(cfg, dtype, (1, 1, tensor))


def layer_param_bytes(cfg, dtype: str, mesh_shape: tuple[int, int, int], layout: str = "train") -> int:
    """Bytes per device of one decoder layer's parameters in `dtype` on a mesh in `layout` (a layer's slice of the
    stacked parameters, which the scan reads in its turn; the layers axis is never split)."""
    stacked = sum(_shard_size(shape, names, mesh_shape, layout)
                  for path, (shape, names) in param_shapes(cfg).items() if path[0] == "layers")
    return stacked // cfg.num_layers * _itemsize(dtype)


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


def lora_param_bytes(cfg, lora, dtype: str, mesh_shape: tuple[int, int, int], layout: str = "train"
                     ) -> tuple[int, int, int]:
    """(frozen base, adapters, adapter count) per device of `Decoder(cfg)` under `lora` (`LoraConfig`) on a mesh in
    `layout`: the base in `dtype` or quantized (`weight_qtype`: int8 values, or nf4's 4-bit codes at half a byte,
    with their scales in `dtype`), the adapters float32; counted on the decoder's own abstract parameters."""
    base = adapters = count = 0
    for shape, names, bits, adapter in _lora_leaves(cfg, lora, dtype):
        size = _shard_size(shape, names, mesh_shape, layout) * bits // 8
        if adapter:
            adapters, count = adapters + size, count + math.prod(shape)
        else:
            base += size
    return base, adapters, count


@functools.lru_cache(maxsize=16)
def _lora_leaves(cfg, lora, dtype: str) -> tuple[tuple[tuple[int, ...], tuple, int, bool], ...]:
    """(shape, logical axes, bits per element, is an adapter) of each parameter of `Decoder(cfg)` under `lora`,
    from the decoder built abstractly (nothing allocated)."""
    import jax.numpy as jnp
    from flax import nnx

    from rrc_jax.models.decoder import Decoder
    from rrc_jax.sharding import model_context

    with model_context(None):
        model = nnx.eval_shape(lambda: Decoder(cfg.replace(lora=lora, param_dtype=dtype), rngs=nnx.Rngs(0)))
    return tuple((tuple(v.shape), tuple(v.out_sharding or ()),
                  4 if v.dtype == jnp.uint4 else jnp.dtype(v.dtype).itemsize * 8, isinstance(v, nnx.LoRAParam))
                 for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))


# ------------------------------------------------------------------------------------------------------------
# The plan
# ------------------------------------------------------------------------------------------------------------

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


def _reward_roles(config) -> frozenset[str]:
    from rrc_jax.constructions import construction_class

    return construction_class(config.reward.kind).roles(config)


def roles(config) -> dict[str, str]:
    """The roles a run loads -> their model names: the policy, the reference for the KL (`rl.beta > 0`) and
    whatever the reward construction declares (`Construction.roles`); under LoRA the reference is the policy's own
    base (`rrc_jax.rl.roles.Roles.shares_base`), not a model of its own, unless `models.reference` names one."""
    m, needs = config.models, _reward_roles(config)
    out = {"policy": m.policy}
    shares = config.policy.lora.rank > 0 and not m.reference  # LoRA: the policy's base with its initial adapters
    if (config.rl.beta > 0 or "reference" in needs) and not shares:
        out["reference"] = m.reference or m.policy
    out.update({role: m[role] for role in ("grm", "drm") if role in needs})
    return out


def _template_tokens(config) -> tuple[int, int]:
    """Estimated tokens of the judge template's fixed text: (instruction + context, item), chat format included."""
    from rrc_jax.judge.templates import get_template

    t = get_template(config.reward.judge.template)
    toy = config.models.grm == "toy"
    rate = 1 if toy else CHARS_PER_TOKEN
    fixed = lambda text: len(re.sub(r"\{(prompt|a|b|response)\}", "", text or ""))
    prefix = -(-(fixed(t.system) + fixed(t.context)) // rate) + (0 if toy else CHAT_FORMAT_TOKENS)
    return prefix, -(-fixed(t.item) // rate)


def _policy_rollouts(config, cfg, shape, dtype, layout: str) -> list[Row]:
    """The rollout phase on mesh `shape` in `layout`: the policy sampler's caches (a step's groups or the held-out
    greedy generation, the larger), its transients and, sampling from the training layout, the weights its decode
    loop gathers."""
    from rrc_jax.models.batches import bucket_length, round_up
    from rrc_jax.inference.sampling import PREFILL_CHUNK
    from rrc_jax.models.kv_cache import ATTENTION_BLOCK
    from rrc_jax.rl.rollout import RolloutConfig
    from rrc_jax.settings import parse

    rl = config.rl
    n_new = rl.max_new_tokens
    prompt = min(bucket_length(config.data.max_prompt_tokens), cfg.max_position_embeddings - n_new)
    max_batch = parse(RolloutConfig, config).max_batch
    prompts = min(rl.prompts_per_step, max(1, max_batch // rl.group_size))  # per sampler call
    rows, own = prompts * rl.group_size, round_up(n_new, ATTENTION_BLOCK)
    group = branched_cache_bytes(cfg, prompts, prompt, rl.group_size, own, shape, dtype)
    eval_rows, eval_slots = min(config.data.eval_prompts, max_batch), round_up(prompt + n_new,
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


def judge_chunk(questions: int, prompts: int, max_batch: int) -> tuple[int, int]:
    """(P, M) of the largest chunk the judge engine packs (`engine.prefix_chunks`) when each of `prompts`
    prefixes has `questions` questions: a prefix's questions in pieces of at most `max_batch`, M the power-of-two
    bucket of a piece, and P the power-of-two bucket of the pieces a chunk takes, as many as keep P x M within
    `max_batch` (at least one)."""
    from rrc_jax.models.batches import bucket_length

    m = bucket_length(min(questions, max_batch), 1)
    fit = max(1, max_batch // m)
    fit = 1 << (fit.bit_length() - 1)  # the largest power of two <= max_batch // M
    pieces = prompts * -(-questions // max_batch)
    return min(bucket_length(pieces, 1), fit), m


def _judging(config, cfg, shape, dtype, layout: str) -> tuple[list[Row], str]:
    """The reward phase of a judge reward on mesh `shape` in `layout`: the call (a step's questions or the judged
    evaluation's) whose caches and transients are the larger; and a note on the estimated question lengths."""
    from rrc_jax.models.batches import length_bucket, round_up
    from rrc_jax.inference.sampling import PREFILL_CHUNK
    from rrc_jax.models.kv_cache import ATTENTION_BLOCK

    r, n_new = config.reward, config.rl.max_new_tokens
    pre_tokens, item_tokens = _template_tokens(config)
    prefix = length_bucket(config.data.max_prompt_tokens + pre_tokens)
    suffix = length_bucket(2 * n_new + item_tokens)
    own = round_up(suffix + r.judge.max_new_tokens, ATTENTION_BLOCK)
    from rrc_jax.constructions import construction_class

    load = construction_class(r.kind).judge_load(config)
    best: list[Row] = []
    for kind, q, prompts in ((r.kind, load.questions, config.rl.prompts_per_step),
                             ("eval", config.eval.judge_votes, config.data.eval_prompts)):
        if not q or not prompts:
            continue
        p, m = judge_chunk(q, prompts, r.judge.max_batch)
        rows = p * m
        out = [Row("judge KV cache", "reward", branched_cache_bytes(cfg, p, prefix, m, own, shape, dtype),
                   f"{kind}: {p} prefixes x {m} rows x {own} slots + {p} shared prefixes (x2 while branching) x "
                   f"{prefix} slots"),
               Row("judge prefill transients", "reward",
                   max(forward_bytes(cfg, p, min(prefix, PREFILL_CHUNK), shape, dtype, keys=ATTENTION_BLOCK),
                       forward_bytes(cfg, rows, min(suffix, PREFILL_CHUNK), shape, dtype,
                                     keys=shared_block(prefix) + ATTENTION_BLOCK),
                       decode_step_bytes(cfg, rows, prefix, shape)),
                   f"one layer; {suffix} suffix tokens in chunks of {min(suffix, PREFILL_CHUNK)} attend to their "
                   f"prefix's {prefix} slots, {shared_block(prefix)} at a time")]
        if layout == "train":
            out.append(Row("gathered GRM weights", "reward", gathered_bytes(cfg, dtype, shape),
                           "one layer at a time, and the LM head"))
        if sum(x.bytes for x in out) > sum(x.bytes for x in best):
            best = out
    note = (f"judge questions estimated at {config.data.max_prompt_tokens} + {pre_tokens} prefix tokens (prompt + "
            f"template), 2 x {n_new} + {item_tokens} suffix tokens, {r.judge.max_new_tokens} new tokens; "
            f"{load.questions} questions and up to {load.tokens} judge tokens per prompt of a step")
    return best, note


def inference_shape(config, topo: Topology, num_heads: int) -> tuple[int, int, int]:
    """The inference layout's mesh `(data, fsdp, tensor)` (`mesh.inference`: `auto`, as
    `rrc_jax.sharding.inference_mesh` makes it, or DATA,FSDP,TENSOR)."""
    from rrc_jax import sharding

    if config.mesh.inference == "auto":
        t = sharding.inference_tensor(topo.devices, topo.host_devices, num_heads)
        return topo.devices // t, 1, t
    return sharding.inference_shape(config.mesh.inference, topo.devices)


def role_layouts(config, topo: Topology, shape: tuple[int, int, int], cfgs: dict) -> dict:
    """Each role's (layout, mesh shape), as `MeshConfig.layout` places it: the policy's master in the training
    layout on `shape`; the reference, GRM and DRM in their `mesh.<role>` layout; `rollout`, the policy's rollout
    copy in the inference layout, unless `rl.share_weights` or one device."""
    from rrc_jax.settings import parse
    from rrc_jax.sharding import MeshConfig

    out, layouts = {}, parse(MeshConfig, config)
    for role, cfg in cfgs.items():
        kind = layouts.kind(role, topo.devices)
        out[role] = (kind, shape if kind == "train" else inference_shape(config, topo, cfg.num_heads))
    if topo.devices > 1 and not config.rl.share_weights:
        out["rollout"] = ("inference", inference_shape(config, topo, cfgs["policy"].num_heads))
    return out


def plan(config, topo: Topology | str, *, mesh: tuple[int, int, int] | None = None,
         micro_batch_size: int | None = None, remat: bool | None = None) -> Plan:
    """The memory `Plan` of trainer `config` on `topo` (a `Topology` or its name), on the config's mesh,
    `rl.micro_batch_size` and `rl.remat` unless `mesh`, `micro_batch_size` or `remat` are given."""
    from rrc_jax.models.batches import bucket_length, length_bucket

    topo = topology(topo) if isinstance(topo, str) else topo
    rl, dtype = config.rl, config.models.dtype
    shape = mesh or resolve_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, topo.devices)
    data, fsdp, tensor = shape
    micro = rl.micro_batch_size if micro_batch_size is None else micro_batch_size
    remat = rl.remat if remat is None else remat
    rows, notes, problems = [], [], []

    field = lambda role: "models.policy" if role == "reference" and not config.models.reference else f"models.{role}"
    cfgs = {role: model_config(name, field=field(role), value_head=role == "drm")
            for role, name in roles(config).items()}
    policy = cfgs["policy"]
    layouts = role_layouts(config, topo, shape, cfgs)
    lora = parse(LoraConfig, config)
    if lora.enabled:
        lora.check_rank(policy, config.models.policy)
    size = lambda n: f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"
    for role, cfg in cfgs.items():
        stored = "float32" if role == "policy" else dtype
        kind, where = layouts[role]
        n = param_count(cfg)
        placed = f"{kind} layout" + ("" if kind == "train" else f" (data={where[0]} tensor={where[2]})")
        if role == "policy" and lora.enabled:  # a frozen base in `dtype` (or quantized), float32 adapters
            base, adapters, count = lora_param_bytes(cfg, lora, dtype, where, kind)
            rows.append(Row("policy base (frozen)", "resident", base,
                            f"{size(n)} {lora.weight_qtype or dtype}, {placed}"))
            rows.append(Row("policy LoRA adapters", "resident", adapters,
                            f"{size(count)} float32, rank {lora.rank} on {lora.targets}"))
            continue
        rows.append(Row(f"{role} parameters", "resident", param_bytes(cfg, stored, where, kind),
                        f"{size(n)} {stored}, {placed}"))
        if cfg.num_kv_heads % where[2]:
            notes.append(f"{role}: tensor={where[2]} does not divide its {cfg.num_kv_heads} kv heads: they are "
                         "replicated over tensor (their weights, KV caches and attention)")
    if lora.enabled and not config.models.reference and (config.rl.beta > 0 or "reference" in _reward_roles(config)):
        notes.append("reference: the policy's frozen base with its initial adapters (LoRA): no second copy")
    if "rollout" in layouts:
        kind, where = layouts["rollout"]
        if lora.enabled:
            base, adapters, _ = lora_param_bytes(policy, lora, dtype, where, kind)
            rows.append(Row("policy rollout copy", "resident", base + adapters,
                            f"{lora.weight_qtype or dtype} base + float32 adapters, inference layout (data={where[0]} "
                            f"tensor={where[2]}); each update syncs the adapters only"))
            merged = param_bytes(policy, dtype, where, kind)
            notes.append(f"weight sync: the adapters only, {adapters / 2**20:.1f} MiB per device per update, against "
                         f"{merged / GiB:.2f} GiB to merge them into a {dtype} copy of the base (every weight "
                         "rewritten): adapters")
        else:
            rows.append(Row("policy rollout copy", "resident", param_bytes(policy, dtype, where, kind),
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
        return Plan(topo, shape, micro, remat, tuple(rows), tuple(notes), tuple(problems), layouts)

    rows += _policy_rollouts(config, policy, layouts.get("rollout", layouts["policy"])[1], dtype,
                             layouts.get("rollout", layouts["policy"])[0])
    if rl.dynamic_sampling:
        notes.append(f"dynamic sampling: a step draws 1 to rl.max_draws = {rl.max_draws} batches of prompts until "
                     "its groups' rewards differ; rollout and judging below are one draw's")
    if "grm" in cfgs:
        judged, note = _judging(config, cfgs["grm"], layouts["grm"][1], dtype, layouts["grm"][0])
        rows += judged
        notes.append(note)
    if "drm" in cfgs:
        length = length_bucket(config.data.max_prompt_tokens + rl.max_new_tokens + CHAT_FORMAT_TOKENS)
        rows.append(Row("DRM forward", "reward", forward_bytes(cfgs["drm"], config.reward.drm.max_batch, length,
                                                               layouts["drm"][1], dtype),
                        f"{config.reward.drm.max_batch} rows x {length} tokens, one layer"))

    length = bucket_length(config.data.max_prompt_tokens + rl.max_new_tokens)
    lp_rows = micro or batch
    scored = [policy] + ([cfgs.get("reference", policy)] if rl.beta > 0 else [])
    rows.append(Row("log-prob pass", "log-prob", max(forward_bytes(c, lp_rows, length, shape, dtype)
                                                      + logprob_chunk_bytes(c, lp_rows, rl.logprob_chunk, shape)
                                                      for c in scored),
                    f"{lp_rows} rows x {length} tokens, one layer + chunk, no gradients"))
    weights = dtype if lora.enabled else "float32"  # the policy's stored weights: a LoRA base is in `dtype`
    rows.append(Row("gathered LM head", "log-prob", gathered_bytes(policy, weights, shape, lm_head_only=True),
                    "hoisted out of the chunk loop"))

    learn_rows = micro or rl.minibatch_size
    accumulating = learn_rows < rl.minibatch_size
    rows.append(Row("activations", "backward", activation_bytes(policy, learn_rows, length, shape, dtype,
                                                                remat=remat),
                    f"{learn_rows} rows x {length} tokens{', remat' if remat else ''}"))
    rows.append(Row("log-prob chunk", "backward", logprob_chunk_bytes(policy, learn_rows, rl.logprob_chunk, shape),
                    f"{LOGPROB_CHUNK_ARRAYS} x [{learn_rows}, {rl.logprob_chunk}, {policy.vocab_size}] float32"))
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
    return Plan(topo, shape, micro, remat, tuple(rows), tuple(notes), tuple(problems), layouts)


# ------------------------------------------------------------------------------------------------------------
# Time: a roofline per phase (docs/planner.md, "Time")
# ------------------------------------------------------------------------------------------------------------

JETSTREAM = dict(model="llama3-8b", topology="v5e-8", rows=128, prompt=1024, new=1024, tokens_per_s=8249.0)
# JetStream serving Llama-3-8B in bf16 on a v5e-8 at batch 128, 1,024 tokens in and out: 8,249 tokens/s
# (AI-Hypercomputer/jetstream-pytorch, benchmarks/summary.md): the planner's sanity anchor.


@dataclasses.dataclass(frozen=True)
class PhaseTime:
    """Seconds of one phase of a step, what bounds it (compute, HBM or interconnect) and how it was counted."""

    name: str
    seconds: float
    bound: str
    detail: str = ""


def matmul_params(cfg) -> int:
    """Parameters a token multiplies by: all but the embedding lookup (the tied embedding is the LM head)."""
    return param_count(cfg) - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)


def _kv_slot_bytes(cfg, dtype: str, tensor: int) -> int:
    """Bytes per device of one token's keys and values in one layer."""
    return 2 * _split(cfg.num_kv_heads, tensor) * cfg.head_dim * _itemsize(dtype)


def _roofline(topo: Topology, flops: float, hbm: float, ici: float) -> tuple[float, str]:
    """max(compute, HBM) plus the interconnect (not overlapped: an upper bound), and the largest term."""
    terms = {"compute": flops / topo.flops, "HBM": hbm / topo.hbm_bw, "interconnect": ici / topo.ici_bw}
    return max(terms["compute"], terms["HBM"]) + terms["interconnect"], max(terms, key=terms.get)


def _allreduce_bytes(cfg, rows: float, dtype: str, tensor: int) -> float:
    """Bytes a device sends per forward of `rows` tokens in the inference layout: two ring all-reduces of
    `[rows, embed]` per layer (after attention and after the MLP) over `tensor` devices."""
    return 2 * cfg.num_layers * rows * cfg.hidden_size * _itemsize(dtype) * 2 * (tensor - 1) / tensor


def forward_time(topo: Topology, cfg, dtype: str, shape, layout: str, tokens: float) -> tuple[float, str]:
    """A forward pass over `tokens` tokens (rows over the mesh's row groups): every weight read once, 2 FLOP per
    parameter and token, and the layout's communication (the inference layout's all-reduces; the training
    layout's gather of every weight over fsdp, a layer at a time)."""
    groups, tensor = shape[0] * shape[1], shape[2]
    flops = 2 * matmul_params(cfg) * tokens / (groups * tensor)
    hbm = param_bytes(cfg, dtype, shape, layout)
    ici = (_allreduce_bytes(cfg, tokens / groups, dtype, tensor) if layout == "inference"
           else gather_traffic_bytes(cfg, dtype, shape))
    return _roofline(topo, flops, hbm, ici)


def decode_time(topo: Topology, cfg, dtype: str, shape, layout: str, rows: int, steps: int, prefixes: int,
                prefix: int, own: int) -> tuple[float, str]:
    """`steps` decode steps of `rows` rows continuing `prefixes` shared prefixes of `prefix` tokens, each row with
    `own` tokens of its own before the first step: per step every weight and every cached token read once (a
    shared prefix once for its rows), 2 FLOP per parameter and row, and the layout's communication."""
    groups, tensor = shape[0] * shape[1], shape[2]
    kv = _kv_slot_bytes(cfg, dtype, tensor)
    per_row = -(-rows // groups)
    cached = (-(-prefixes // groups) * prefix * cfg.num_layers  # a sliding layer's own slots: its window at most
              + per_row * layer_slots(cfg, own + steps / 2)) * kv  # (the mean over the steps)
    flops = 2 * matmul_params(cfg) * per_row / tensor
    hbm = param_bytes(cfg, dtype, shape, layout) + cached
    ici = (_allreduce_bytes(cfg, per_row, dtype, tensor) if layout == "inference"
           else gather_traffic_bytes(cfg, dtype, shape))  # the training layout gathers every layer at every step
    step, bound = _roofline(topo, flops, hbm, ici)
    return steps * step, bound


def step_times(config, p: Plan) -> list[PhaseTime]:
    """The roofline seconds of each phase of one step of `config` on plan `p`'s topology and layouts."""
    from rrc_jax.constructions import construction_class
    from rrc_jax.models.batches import bucket_length, length_bucket

    topo, rl, dtype = p.topology, config.rl, config.models.dtype
    policy = model_config(config.models.policy)
    prompt = bucket_length(config.data.max_prompt_tokens)
    rows, new = rl.prompts_per_step * rl.group_size, rl.max_new_tokens
    kind, where = p.layouts.get("rollout", p.layouts["policy"])
    stored = dtype if kind == "inference" else "float32"
    out = [PhaseTime("rollout prefill", *forward_time(topo, policy, stored, where, kind, rl.prompts_per_step * prompt),
                     f"{rl.prompts_per_step} prompts x {prompt} tokens, each once for its group"),
           PhaseTime("rollout decode", *decode_time(topo, policy, stored, where, kind, rows, new, rl.prompts_per_step,
                                                    prompt, 0),
                     f"{rows} rows x {new} tokens, {kind} layout (data={where[0] * where[1]} tensor={where[2]})")]
    if "grm" in p.layouts:
        grm, (gkind, gwhere) = model_config(config.models.grm, field="models.grm"), p.layouts["grm"]
        r = config.reward
        pre, item = _template_tokens(config)
        prefix, suffix = length_bucket(config.data.max_prompt_tokens + pre), length_bucket(2 * new + item)
        questions = construction_class(r.kind).judge_load(config).questions * rl.prompts_per_step
        chunks, chunk = -(-questions // r.judge.max_batch), min(questions, r.judge.max_batch)
        prefill = forward_time(topo, grm, dtype, gwhere, gkind, rl.prompts_per_step * prefix + questions * suffix)
        decode = decode_time(topo, grm, dtype, gwhere, gkind, chunk, r.judge.max_new_tokens,
                             max(1, chunk * rl.prompts_per_step // max(questions, 1)), prefix, suffix)
        out += [PhaseTime("judge prefill", *prefill, f"{rl.prompts_per_step} prefixes x {prefix} + {questions} "
                                                     f"questions x {suffix} tokens"),
                PhaseTime("judge decode", chunks * decode[0], decode[1],
                          f"{chunks} chunks of {chunk} questions x {r.judge.max_new_tokens} tokens, {gkind} layout")]
    length, shape = prompt + new, p.mesh
    passes = int(rl.mu > 1 or rl.minibatch_size < rows) + int(rl.beta > 0)
    if passes:
        one, bound = forward_time(topo, policy, "float32", shape, "train", rows * length)
        out.append(PhaseTime("log-prob passes", passes * one, bound, f"{passes} x {rows} rows x {length} tokens"))
    updates = rl.mu * -(-rows // rl.minibatch_size)
    flops = (8 if p.remat else 6) * matmul_params(policy) * rl.mu * rows * length / topo.devices
    ici = updates * 3 * gather_traffic_bytes(policy, "float32", shape)  # gather (forward, backward), reduce-scatter
    out.append(PhaseTime("update", *_roofline(topo, flops, updates * 3 * p.rows[0].bytes, ici),
                         f"{updates} updates, {'8' if p.remat else '6'} FLOP per parameter and token"))
    if "rollout" in p.layouts:
        copy = param_bytes(policy, dtype, p.layouts["rollout"][1], "inference")
        out.append(PhaseTime("weight sync", copy / topo.ici_bw, "interconnect",
                             f"{copy / GiB:.2f} GiB a device into the rollout copy"))
    return out


def decode_tokens_per_s(config, p: Plan, times: list[PhaseTime]) -> float:
    """Rollout tokens a chip decodes per second (its prefill included)."""
    rollout = sum(t.seconds for t in times if t.name.startswith("rollout"))
    return config.rl.prompts_per_step * config.rl.group_size * config.rl.max_new_tokens / rollout / p.topology.devices


def jetstream_prediction() -> float:
    """The roofline's tokens/s (all chips) for `JETSTREAM`'s configuration: prefill then decode of every row, the
    model in the inference layout over the host's 8 chips."""
    j, topo = JETSTREAM, topology(JETSTREAM["topology"])
    cfg, shape = model_config(j["model"]), (1, 1, topo.devices)
    prefill = forward_time(topo, cfg, "bfloat16", shape, "inference", j["rows"] * j["prompt"])[0]
    decode = decode_time(topo, cfg, "bfloat16", shape, "inference", j["rows"], j["new"], j["rows"], j["prompt"], 0)[0]
    return j["rows"] * j["new"] / (prefill + decode)


def format_times(config, p: Plan) -> str:
    """The step-time breakdown, the rollout's tokens/s per chip and the JetStream anchor."""
    times = step_times(config, p)
    total = sum(t.seconds for t in times)
    lines = [f"{'phase (roofline)':<30} {'seconds':>10}  {'bound':<12} detail", "-" * 110]
    lines += [f"{t.name:<30} {t.seconds:>10.2f}  {t.bound:<12} {t.detail}" for t in times]
    lines.append(f"{'step':<30} {total:>10.2f}")
    got = jetstream_prediction()
    lines.append(f"rollout: {decode_tokens_per_s(config, p, times):,.0f} tokens/s a chip; anchor: JetStream's "
                 f"Llama-3-8B bf16 v5e-8 batch 128 (1,024 in / out) predicted {got:,.0f} tokens/s, published "
                 f"{JETSTREAM['tokens_per_s']:,.0f} (ratio {got / JETSTREAM['tokens_per_s']:.2f})")
    return "\n".join(lines)


def _factorizations(n: int) -> list[tuple[int, int, int]]:
    """Every (data, fsdp, tensor) with product n."""
    return [(d, n // t // d, t) for t in range(1, n + 1) if n % t == 0 for d in range(1, n // t + 1)
            if (n // t) % d == 0]


def _candidates(config, topo: Topology) -> list[Plan]:
    """Plans of every `(data, fsdp, tensor)` factorization of the device count, every micro-batch size dividing
    `rl.minibatch_size`, with the config's remat setting and with remat."""
    mb = config.rl.minibatch_size
    return [plan(config, topo, mesh=shape, micro_batch_size=micro, remat=remat)
            for remat in sorted({bool(config.rl.remat), True})
            for shape in _factorizations(topo.devices)
            for micro in range(mb, 0, -1) if mb % micro == 0]


def suggest(config, topo: Topology | str) -> Plan | None:
    """The plan of a mesh, micro-batch size and remat setting that fit, or None: the first of the fitting
    candidates (`_candidates`) by `_preference`."""
    topo = topology(topo) if isinstance(topo, str) else topo
    return min((p for p in _candidates(config, topo) if p.fits), key=_preference, default=None)


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


def report(config, topo: Topology | str) -> str:
    """`format_table` of the config's plan and, when it does not fit, the suggestion."""
    p = plan(config, topo)
    out = format_table(p)
    if not p.problems:
        out += "\n\n" + format_times(config, p)
    if p.fits:
        return out
    candidates = _candidates(config, p.topology)
    fitting = [c for c in candidates if c.fits]
    flags = lambda s: (f"--config.mesh.data={s.mesh[0]} --config.mesh.fsdp={s.mesh[1]} --config.mesh.tensor="
                       f"{s.mesh[2]} --config.rl.micro_batch_size={s.micro_batch}"
                       + (" --config.rl.remat=True" if s.remat else ""))
    if not fitting:
        usable = [c for c in candidates if not c.problems]
        low = min(usable, key=lambda c: c.peak_bytes, default=None)
        bf16 = " or --config.models.dtype=bfloat16" if config.models.dtype == "float32" else ""
        return out + (f"\nsuggestion: nothing fits on {p.topology.name} (any mesh, micro-batch size, remat); use more "
                      f"devices, shorter sequences{bf16}" + (
                          f". The smallest peak, {low.peak_bytes / GiB:.2f} GiB ({low.largest_phase}), is with "
                          f"{flags(low)}" if low else ""))
    s = min(fitting, key=_preference)
    return out + f"\nsuggestion: {flags(s)} ({s.peak_bytes / GiB:.2f} of {s.topology.hbm_bytes / GiB:.2f} GiB)"


# ------------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------------

def _main(argv) -> None:
    from rrc_jax import cli
    from rrc_jax.config import validate

    config = cli.config_value(_CONFIG, argv, "agr.py")

    def run():
        validate(config)
        print(report(config, _TOPOLOGY.value))

    cli.exit_on_user_error(run)


if __name__ == "__main__":
    from absl import flags

    from rrc_jax import cli

    _CONFIG = cli.config_flag("agr.py, scr.py, prc.py, drm.py")
    _TOPOLOGY = flags.DEFINE_string("topology", "v5e-8", "v4-N, v5p-N (TensorCores), v5e-N, v6e-N (chips), h100-N, "
                                                         "h200-N (GPUs), cpu-N")
    cli.start(_main)
