"""The error a user can cause and fix (a bad config value, a missing or malformed file, an unknown name), and a run
that stopped itself because it diverged.

Command-line entry points print a `ConfigError` as one line (`error: ...`) and exit; every other exception keeps
its traceback, since it is a bug to report, not a setting to change. It subclasses `ValueError` so that library
callers catching `ValueError` keep working.
"""


class ConfigError(ValueError):
    """A user mistake; the message names the setting or file and how to fix it."""


class Diverged(RuntimeError):
    """A run stopped by its divergence guard (`rrc_jax.rl.guard`); the message names the cause and the step."""


def exit_on_user_error(fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, for a command line: a `ConfigError` or a missing file exits with the one line
    `error: <message>` (status 1), a `Diverged` run with `stopped: <message>` (status 3); any other exception
    propagates with its traceback."""
    import sys

    try:
        return fn(*args, **kwargs)
    except (ConfigError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    except Diverged as e:
        print(f"stopped: {e}", file=sys.stderr)
        sys.exit(3)
