"""The reward service: the cohorts its requests fill (`cohorts`), its HTTP endpoint (`app`) and the judge of its
cohorts (`rewards`)."""
