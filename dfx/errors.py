"""The error of the contract."""


class ObjectFileError(ValueError):
    """A `.kpu` file that cannot be used; str(e) is one line naming file, place and reason."""
