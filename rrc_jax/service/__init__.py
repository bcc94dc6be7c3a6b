"""The reward service's parts: the cohorts its requests fill (`cohorts`)."""
