"""How every tool reads a file: a regular file only, bounded by a size that fits its kind,
checked before a byte is read.

A FIFO, a device (a link to /dev/zero), a socket or a folder is refused: reading one may block
for ever or never end. The file is opened without blocking, then its kind and size are taken
from the open file (not the path, which may change between the two), and at most the bound plus
one byte is read, so a file that grows while it is read is still refused rather than swallowed.
Where links must not be followed (a shared cache), the file is opened without following one and
its count of names taken from the open file too.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

KB = 1024
MB = 1024 * KB
GB = 1024 * MB


class InputFileError(ValueError):
    """A file that cannot be read; str(e) is one line naming the path and the reason, `reason`
    the reason alone. `kind` says what was refused for what it is: missing, link, hard link,
    folder, FIFO, device, socket or other (not a regular file); None for any other reason."""

    def __init__(self, where: str, reason: str, kind: str | None = None) -> None:
        super().__init__(f"{where}: {reason}")
        self.reason, self.kind = reason, kind


def _kind(mode: int) -> tuple[str, str]:
    """The kind of a file that is not a regular one: its code and its words."""
    if stat.S_ISDIR(mode):
        return "folder", "a folder"
    if stat.S_ISFIFO(mode):
        return "FIFO", "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device", "a device"
    if stat.S_ISSOCK(mode):
        return "socket", "a socket"
    return "other", "not a regular file"


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


def _open(path: str | os.PathLike[str], where: str, follow_links: bool) -> tuple[BinaryIO, os.stat_result]:
    """The regular file at `path`, open, and its stat taken from the open file. Without
    `follow_links`, a link or a file of more than one name is refused."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow_links and e.errno == errno.ELOOP:
            raise InputFileError(where, "cannot read: a link, not followed", "link") from None
        kind = "missing" if e.errno == errno.ENOENT else None
        raise InputFileError(where, f"cannot read: {e.strerror or e}", kind) from None
    except ValueError:  # an embedded NUL: no file can have that name
        raise InputFileError(where, "cannot read: a file name cannot hold a NUL character") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind, words = _kind(info.st_mode)
        raise InputFileError(where, f"cannot read: {words}, not a regular file", kind)
    if not follow_links and info.st_nlink != 1:
        os.close(fd)
        raise InputFileError(where, "cannot read: the file has other names (hard links)", "hard link")
    return os.fdopen(fd, "rb"), info


def read_input_file(path: str | os.PathLike[str], what: str, max_bytes: int, *,
                    follow_links: bool = True) -> bytes:
    """The bytes of the regular file at `path`; `what` (an object file, a config) names the kind in
    the refusal of a file larger than `max_bytes`. Raises InputFileError."""
    where = shown_path(path)
    file, info = _open(path, where, follow_links)
    with file:
        if info.st_size > max_bytes:
            raise InputFileError(where, f"{size_words(info.st_size)}, larger than the "
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
            raise InputFileError(where, f"cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise InputFileError(where, f"grew past the {size_words(max_bytes)} a {what} may be while read")
    return data


def read_input_slice(path: str | os.PathLike[str], what: str, offset: int, length: int, *,
                     follow_links: bool = True) -> bytes:
    """Exactly `length` bytes from `offset` of the regular file at `path` (the caller bounds
    `length`); `what` (data) names the slice as the file's: "its data". Raises InputFileError."""
    where = shown_path(path)
    file, info = _open(path, where, follow_links)
    with file:
        if info.st_size < offset + length:
            raise InputFileError(where, f"its {info.st_size} bytes end before the {length} its {what} takes "
                                        f"from offset {offset}")
        try:
            file.seek(offset)
            data = file.read(length)
        except OSError as e:
            raise InputFileError(where, f"cannot read: {e.strerror or e}") from None
    if len(data) != length:  # the file shrank while it was read
        raise InputFileError(where, f"ends before the {length} bytes its {what} takes from offset {offset}")
    return data
