"""Packaged recipes: `--config=NAME.py` (or a bare NAME) finds them from any directory."""
