"""The reward service: the cohorts its requests fill (`cohorts`) and its HTTP endpoint (`app`)."""
