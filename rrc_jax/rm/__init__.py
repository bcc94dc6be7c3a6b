"""Reward-model training: preference examples (`examples`), losses (`losses`: SFT Eq. 2, Bradley-Terry Eq. 1),
the supervised loop on the shared learner (`fit`), a DRM's scores (`scores`) and the evaluation of reward models
(`evaluation`)."""
