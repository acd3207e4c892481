"""The one exception type users see: a problem with what they asked for, and how to fix it."""


class ScaleRLError(Exception):
    """A user-facing error: the CLI prints `str(err)` on one line and exits with code 2.

    The message names the field, file or name at fault and says what to do instead.
    """
