"""The one exception type for mistakes a user can fix: the CLI prints it as one line, exit 2."""


class InputError(Exception):
    """Bad input from the user: a missing path, a malformed file, a contradictory flag.

    The message names the file or flag and says what to do; no traceback is shown.
    """


class RunError(Exception):
    """A run that cannot go on (e.g. a non-finite loss): one line naming where, exit status 1."""
