"""Data: prompt datasets, grain pipelines and the embedded toy world."""
