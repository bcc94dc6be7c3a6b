"""RRC rewards as a TRL reward function: `GRPOTrainer(reward_funcs=[TRLReward(judge, "scr", group_size=G)])`.

TRL calls a reward function with `prompts`, `completions` (one each per completion: each prompt repeated G times,
its completions side by side), `completion_ids`, the dataset's other columns and `trainer_state`, and takes one
float per completion (`trl.GRPOTrainer`, TRL 1.x). `TRLReward` judges each prompt's group whole
(`rrc_jax.integrations.groups`) and reseeds the judge from `trainer_state.global_step`, so a resumed run asks what
an uninterrupted one would.

Several processes (`accelerate launch`): each calls the reward function on its own slice of the batch, and a slice
splits a group unless `per_device_train_batch_size x steps_per_generation` is a multiple of `num_generations`. The
slices are then gathered, every group judged once and the rewards scattered back (`groups.judge_whole`, through
accelerate's `gather_object`); with whole groups in every slice nothing is gathered.

The judge's `judge/*` metrics of the step are logged through TRL's `log_metric` when it passes one (a rate of
nothing, NaN, is left out: `judge/position_consistency` without a swapped couple).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rrc_jax.integrations.groups import Alone, Collective, GroupRewards, judge_whole, rows_of
from rrc_jax.judge import Judge
from rrc_jax.service.client import ServedRewards


class AccelerateCollective:
    """The processes of an accelerate launch as a `groups.Collective` (`gather_object`)."""

    def __init__(self):
        from accelerate import PartialState  # the trl extra

        state = PartialState()
        self.rank, self.size = state.process_index, state.num_processes

    def all_gather(self, items: list) -> list:
        from accelerate.utils import gather_object  # the trl extra

        return list(gather_object(list(items)))


class TRLReward:
    """A TRL reward function of RRC rewards (`groups.GroupRewards`; its arguments), named `rrc_<kind>` in TRL's
    logs (`rewards/rrc_scr/mean`). `judge` is the GRM, or the URL of a reward service (`python -m rrc_jax.service`:
    its recipe is then the reward, `kind` and the settings are its own; `api_key` its token). `anchors_column` (AGR)
    and `reference_column` (PRC) name the dataset columns that hold each prompt's anchors and reference response.
    `comm`: the processes (default: accelerate's when it runs several, else this one alone)."""

    def __init__(self, judge: Judge | str, kind: str = "scr", *, group_size: int, anchors_column: str = "anchors",
                 reference_column: str = "reference", comm: Collective | None = None, api_key: str = "",
                 **settings):
        if isinstance(judge, str):
            if settings:
                raise ValueError(f"{', '.join(settings)}: a served reward's settings are its recipe's (the service's "
                                 "--config)")
            self.rewards, kind = ServedRewards(judge, group_size=group_size, api_key=api_key), "served"
        else:
            self.rewards = GroupRewards(judge, kind, group_size=group_size, **settings)
        self.anchors_column, self.reference_column = anchors_column, reference_column
        self.comm = comm
        self.__name__ = f"rrc_{kind}"

    def _collective(self) -> Collective:
        if self.comm is None:
            try:
                self.comm = AccelerateCollective()
            except ImportError:  # not under accelerate (TRL always brings it)
                self.comm = Alone()
        return self.comm

    def __call__(self, prompts: Sequence, completions: Sequence, completion_ids=None, trainer_state=None,
                 log_metric=None, **columns) -> list[float]:
        """One reward per completion `[len(completions)]` (the module docstring)."""
        wants = self.rewards.columns
        rows = rows_of(prompts, completions, columns.get(self.anchors_column) if "anchors" in wants else None,
                       columns.get(self.reference_column) if "reference" in wants else None)
        step = getattr(trainer_state, "global_step", None)
        rewards = judge_whole(rows, self.rewards.group_size, lambda whole: self.rewards(whole, step),
                              self._collective())
        if log_metric is not None:  # a rate of nothing (NaN: no swapped couple, no question) is not a value to log
            for name, value in self.rewards.last_metrics.items():
                if not math.isnan(value):
                    log_metric(name, value)
        return [float(r) for r in rewards]
