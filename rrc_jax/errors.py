"""The error a user can cause and fix: a bad config value, a missing or malformed file, an unknown name.

Command-line entry points print a `ConfigError` as one line (`error: ...`) and exit; every other exception keeps
its traceback, since it is a bug to report, not a setting to change. It subclasses `ValueError` so that library
callers catching `ValueError` keep working.
"""


class ConfigError(ValueError):
    """A user mistake; the message names the setting or file and how to fix it."""
