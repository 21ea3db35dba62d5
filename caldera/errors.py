"""Exceptions that cross module boundaries, and the exit codes they mean."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A usage or configuration problem: the CLI prints it and exits 2."""


class ConfigError(UsageError):
    """A bad configuration value; the message names the variable or file."""


class CommandError(Exception):
    """A control-plane command failed; the message becomes finish.error_message."""

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message)
        self.result = result
