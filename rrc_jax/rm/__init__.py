"""Reward-model training: preference examples (`examples`), losses (`losses`: SFT Eq. 2, Bradley-Terry Eq. 1) and
the supervised loop on the shared learner (`fit`)."""
