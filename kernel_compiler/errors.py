"""The one error the compiler reports: a single line naming file, place and reason."""


class CompileError(ValueError):
    """Bad input to the compiler; str(e) is the whole one-line message."""
