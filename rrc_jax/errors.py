"""The error a user can cause and fix (a bad config value, a missing or malformed file, an unknown name), and a run
that stopped itself because it diverged.

Command lines print a `ConfigError` as one line (`error: ...`) and exit (`rrc_jax.cli.exit_on_user_error`); every other exception keeps
its traceback, since it is a bug to report, not a setting to change. It subclasses `ValueError` so that library
callers catching `ValueError` keep working.
"""


class ConfigError(ValueError):
    """A user mistake; the message names the setting or file and how to fix it."""


class Diverged(RuntimeError):
    """A run stopped by its divergence guard (`rrc_jax.rl.guard`); the message names the cause and the step."""
