"""What a reward construction is built from: the `RewardContext` (the run's models by role, the policy sampler and
how it samples, the training prompts)."""

from __future__ import annotations

from collections.abc import Sequence

from rrc_jax.constructions.judged import make_judge
from rrc_jax.data.prompts import PromptSet, prompt_tokens
from rrc_jax.inference.factory import role_sampler
from rrc_jax.inference.sampler import Sampler, response_texts
from rrc_jax.judge import Judge


class RewardContext:
    """What a reward construction may use. The policy sampler holds the model being trained; the reference and the
    judge are built on first use (a run that never asks for them never loads them). `roles`: the run's models by
    role (`rrc_jax.rl.roles.Roles`); `settings`: the run's (`rrc_jax.config.TrainerSettings`), of which `rollout`
    says how the policy samples (`RolloutConfig`)."""

    def __init__(self, settings, roles, policy: Sampler, tokenizer, train: PromptSet):
        self.settings, self.roles, self.policy, self.tokenizer, self.train = settings, roles, policy, tokenizer, train
        self.rollout = settings.rollout
        self._reference: Sampler | None = None
        self._judge: Judge | None = None

    def reference(self) -> Sampler:
        """A sampler of the frozen reference policy (`models.reference`, by default the initial policy)."""
        if self._reference is None:
            self._reference = role_sampler(self.roles, "reference", engine=self.settings.inference,
                                           max_batch=self.rollout.max_batch)
        return self._reference

    def judge(self) -> Judge:
        """The GRM as a `Judge` (`reward.judge`), built once, shared by the reward and its held-out evaluation."""
        if self._judge is None:
            self._judge = make_judge(self.settings, self.roles)
        return self._judge

    def greedy_texts(self, sampler: Sampler, prompts: Sequence[str], prompt_set: PromptSet | None = None
                     ) -> list[str]:
        """The greedy response of `sampler`'s model to each of `prompts` (texts of `prompt_set`, default the
        training prompts), rendered as the policy sees them (`prompt_tokens`)."""
        ids = [prompt_tokens(self.tokenizer, prompt_set or self.train, p) for p in prompts]
        return response_texts(self.tokenizer, sampler.generate(ids, 1, self.rollout.greedy))
