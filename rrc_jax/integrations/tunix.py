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

from rrc_jax.integrations.groups import GroupRewards, rows_of
from rrc_jax.judge import Judge


class TunixReward:
    """A tunix reward function of RRC rewards (`groups.GroupRewards`; its arguments except `group_size`, which
    tunix passes as `num_generations`). `anchors_column` (AGR) and `reference_column` (PRC) name the batch's
    columns that hold each prompt's anchors and reference response. `last_metrics`: the last call's `judge/*`."""

    def __init__(self, judge: Judge, kind: str = "scr", *, anchors_column: str = "anchors",
                 reference_column: str = "reference", **settings):
        self.judge, self.kind, self.settings = judge, kind, settings
        self.anchors_column, self.reference_column = anchors_column, reference_column
        self.rewards: GroupRewards | None = None
        self.__name__ = f"rrc_{kind}"

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
            self.rewards = GroupRewards(self.judge, self.kind, group_size=int(num_generations), **self.settings)
        rows = rows_of(list(map(str, prompts)), list(map(str, completions)),
                       columns.get(self.anchors_column) if self.kind == "agr" else None,
                       columns.get(self.reference_column) if self.kind == "prc" else None)
        return [float(r) for r in self.rewards(rows)]
