"""The one exception type that means "the user can fix this".

The CLI turns a `SpecError` into a single line on stderr and a non-zero exit; anything else is a bug and
keeps its traceback.
"""


class SpecError(Exception):
    """A problem with the user's input, files or settings, described in one line."""


class BadInput(SpecError):
    """A file or value given that cannot be used at all (an image that is not one, an mmproj for another
    model): the command line's usage error, as Click's (exit 2)."""
