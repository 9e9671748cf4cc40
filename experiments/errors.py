"""The one exception type that the entry point reports as a single line (no traceback)."""


class UserError(Exception):
    """A problem the user can fix (configuration, devices, data, divergence), with a message
    that says what went wrong and what to do."""
