"""RRC rewards as a tunix reward function: `GRPOLearner(rl_cluster, algo_config, reward_fns=[TunixReward(judge)])`.

tunix's `GRPOLearner` (google-tunix 0.1.x) calls each reward function once per global batch with `prompts` and
`completions` (each prompt repeated G times, its completions side by side: `np.repeat`), the batch's other columns
(numpy arrays, repeated likewise), `mode` and `trajectory_ids`, and, for a parameter named after a `GRPOConfig`
field, that field's value: `TunixReward` names `num_generations`, so its group size is the learner's own. It returns
one float per completion. One controller holds the whole batch, so every group is judged whole where it is.

The judge may be in the same process (the JAX engine; tunix calls reward functions on a thread of its own, and the
judge runs there) or served over HTTP (`rrc_jax.integrations.judge_for(DIR, url=...)`). tunix is an optional extra
(`pip install 'rrc-jax[tunix]'`, see pyproject.toml: it pins `safetensors<0.8`, so pip moves transformers back to a
release that accepts it); this module does not import it.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from rrc_jax.integrations.groups import GroupRewards, rows_of
from rrc_jax.judge import Judge
from rrc_jax.models.hf_io import decoder_config
from rrc_jax.service.client import ServedRewards


class TunixReward:
    """A tunix reward function of RRC rewards (`groups.GroupRewards`; its arguments except `group_size`, which
    tunix passes as `num_generations`). `judge` is the GRM, or the URL of a reward service (`python -m
    rrc_jax.service`: its recipe is the reward; `api_key` its token). `anchors_column` (AGR) and `reference_column`
    (PRC) name the batch's columns that hold each prompt's anchors and reference response. `last_metrics`: the last
    call's `judge/*`."""

    def __init__(self, judge: Judge | str, kind: str = "scr", *, anchors_column: str = "anchors",
                 reference_column: str = "reference", api_key: str = "", **settings):
        if isinstance(judge, str) and settings:
            raise ValueError(f"{', '.join(settings)}: a served reward's settings are its recipe's (the service's "
                             "--config)")
        self.judge, self.kind, self.settings, self.api_key = judge, kind, settings, api_key
        self.anchors_column, self.reference_column = anchors_column, reference_column
        self.rewards: GroupRewards | ServedRewards | None = None
        self.__name__ = "rrc_served" if isinstance(judge, str) else f"rrc_{kind}"

    @property
    def last_metrics(self) -> dict[str, float]:
        return self.rewards.last_metrics if self.rewards is not None else {}

    def __call__(self, prompts: Sequence, completions: Sequence, num_generations: int | None = None,
                 **columns) -> list[float]:
        """One reward per completion `[len(completions)]`; `num_generations` is G (tunix passes it)."""
        if num_generations is None:
            raise ValueError("TunixReward: num_generations is missing; tunix's GRPOLearner passes its GRPOConfig's "
                             "(call it as reward_fn(prompts=..., completions=..., num_generations=G))")
        if self.rewards is None or self.rewards.group_size != num_generations:
            g = int(num_generations)
            self.rewards = (ServedRewards(self.judge, group_size=g, api_key=self.api_key)
                            if isinstance(self.judge, str) else
                            GroupRewards(self.judge, self.kind, group_size=g, **self.settings))
        rows = rows_of(list(prompts), list(completions),
                       columns.get(self.anchors_column) if "anchors" in self.rewards.columns else None,
                       columns.get(self.reference_column) if "reference" in self.rewards.columns else None)
        return [float(r) for r in self.rewards(rows)]


TUNIX_ROPE_THETA = 1e6  # tunix 0.1.7's Llama applies RoPE with this base whatever its config says


def tunix_mesh(fsdp: int = 1, tp: int = 1):
    """A mesh over the first `fsdp x tp` devices with the axis names tunix's Llama shards by (`fsdp`, `tp`), its axes
    `Auto` (tunix's embedding lookup fails under JAX's default `Explicit` axes)."""
    return jax.make_mesh((fsdp, tp), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=jax.devices()[:fsdp * tp])


def tunix_llama(path, mesh, dtype=None):
    """The Llama checkpoint in the Hugging Face directory `path` as tunix's Llama 3 model on `mesh`, its architecture
    read as this project reads it (`rrc_jax.models.hf_io.decoder_config`). tunix's Llama applies RoPE with base
    `TUNIX_ROPE_THETA` and no scaling whatever the checkpoint says: a checkpoint with another base computes
    otherwise there (same cost)."""
    from tunix.models.llama3 import model as llama3_model  # the tunix extra
    from tunix.models.llama3 import params as llama3_params  # the tunix extra

    cfg = decoder_config(path)
    if cfg.model_type != "llama":
        raise ValueError(f"{path}: a {cfg.model_type} checkpoint; tunix_llama loads Llama checkpoints")
    config = llama3_model.ModelConfig(
        num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
        hidden_dim=cfg.intermediate_size, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
        num_kv_heads=cfg.num_kv_heads, rope_theta=int(cfg.rope_theta), norm_eps=cfg.rms_norm_eps,
        weight_tying=cfg.tie_word_embeddings)
    return llama3_params.create_model_from_safe_tensors(str(path), config, mesh=mesh,
                                                        **({} if dtype is None else {"dtype": dtype}))
