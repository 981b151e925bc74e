"""How every tool reads a file: a regular file only, bounded by a size that fits its kind,
checked before a byte is read.

A FIFO, a device (a link to /dev/zero), a socket or a folder is refused: reading one may block
for ever or never end. The file is opened without blocking, then its kind and size are taken
from the open file (not the path, which may change between the two), and at most the bound plus
one byte is read, so a file that grows while it is read is still refused rather than swallowed.
"""

from __future__ import annotations

import os
import stat

KB = 1024
MB = 1024 * KB
GB = 1024 * MB


class InputFileError(ValueError):
    """A file that cannot be read; str(e) is one line naming the path and the reason."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def size_words(n: int) -> str:
    """A byte count as a person reads it: 512 KB, 2 MB, 1 GB."""
    for unit, name in ((GB, "GB"), (MB, "MB"), (KB, "KB")):
        if n >= unit:
            return f"{n / unit:.3g} {name}"
    return f"{n} bytes"


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path fit for a one-line message: its line breaks and NULs escaped, a long one clipped."""
    text = os.fspath(path)
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= 200 else text[:100] + "..." + text[-60:]


def read_input_file(path: str | os.PathLike[str], what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`; `what` (an object file, a config) names the kind in
    the refusal of a file larger than `max_bytes`. Raises InputFileError."""
    where = shown_path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise InputFileError(f"{where}: cannot read: {e.strerror or e}") from None
    except ValueError:  # an embedded NUL: no file can have that name
        raise InputFileError(f"{where}: cannot read: a file name cannot hold a NUL character") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise InputFileError(f"{where}: cannot read: {_kind(info.st_mode)}, not a regular file")
    with os.fdopen(fd, "rb") as file:
        if info.st_size > max_bytes:
            raise InputFileError(f"{where}: {size_words(info.st_size)}, larger than the "
                                 f"{size_words(max_bytes)} a {what} may be")
        try:
            # read(n) allocates n bytes first: ask for what the file holds, plus one to see it grow
            data = file.read(info.st_size + 1)
            while info.st_size < len(data) <= max_bytes:  # it grew: read on in steps, up to the bound
                more = file.read(min(max_bytes + 1 - len(data), MB))
                if not more:
                    break
                data += more
        except OSError as e:
            raise InputFileError(f"{where}: cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise InputFileError(f"{where}: grew past the {size_words(max_bytes)} a {what} may be while read")
    return data
