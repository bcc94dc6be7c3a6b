"""The reward service: the cohorts its requests fill (`cohorts`), its HTTP endpoint (`app`), the judge of its
cohorts (`rewards`), the peers' requests (`protocols`) and a trainer's side of it (`client`; `remote`, the standard
library's part, which verl loads by path)."""
