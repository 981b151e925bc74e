"""How both tools write files: all of a run's outputs appear together, or none does.

`OutputFiles` is one run's set of output files. `claim` checks each path before any work
(its nearest existing folder is a folder, nothing but a regular file or a link is in the way, it is not one of the
run's own inputs, no two outputs share it). `stage` writes a file's bytes to a private temp file
in the target folder, created exclusively, so no existing file, link or FIFO is ever opened or
followed. `commit` renames every staged file into place once the whole run has succeeded; a
rename replaces a link at the path, never its target. On any failure the temp files go and the
paths keep what they held before. Messages name the user's path, never a temp file.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO


class OutputError(ValueError):
    """An output that cannot be written; str(e) is one line naming the path."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class OutputFiles:
    def __init__(self, inputs: Iterable[str | os.PathLike[str]] = ()):
        self._inputs = [Path(p) for p in inputs]
        self._claimed: list[Path] = []
        self._staged: list[tuple[Path, Path]] = []  # (temp file, path)
        self._made_dirs: list[Path] = []

    def claim(self, path: str | os.PathLike[str]) -> Path:
        """Check that `path` can take an output; missing folders on its way are made when staging
        (and removed again if the run fails)."""
        path = Path(path)
        if path.name in ("", ".", ".."):
            raise OutputError(f"{path}: not a file name")
        if any(_same(path, p) for p in self._claimed):
            raise OutputError(f"{path}: named for two outputs of this run")
        for p in self._inputs:
            if _same(path, p):
                raise OutputError(f"{path}: is an input of this run ({p}); choose another output path")
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            problem = "is not a folder" if folder.exists() else "does not exist"
            raise OutputError(f"{path}: cannot write: {folder} {problem}")
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            mode = None
        except OSError as e:
            raise OutputError(f"{path}: cannot write: {e.strerror}") from None
        if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise OutputError(f"{path}: cannot write: {what} is in the way")
        self._claimed.append(path)
        return path

    def stage(self, path: Path, content: bytes | Callable[[BinaryIO], None]) -> None:
        """Write `content` (bytes, or a function writing to a binary file) for claimed `path`."""
        assert path in self._claimed, path
        try:
            self._make_dir(path.parent)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:64]}.", suffix=".partial")
        except OSError as e:
            raise OutputError(f"{path}: cannot write: {e.strerror}") from None
        self._staged.append((Path(tmp), path))
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # the permissions a plain open() would give
            with os.fdopen(fd, "wb") as f:
                if isinstance(content, bytes):
                    f.write(content)
                else:
                    content(f)
        except OSError as e:
            raise OutputError(f"{path}: cannot write: {e.strerror}") from None

    def commit(self) -> None:
        for tmp, path in self._staged:
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise OutputError(f"{path}: cannot write: {e.strerror}") from None
        self._staged.clear()
        self._made_dirs.clear()

    def discard(self) -> None:
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged.clear()
        for d in reversed(self._made_dirs):
            try:
                d.rmdir()
            except OSError:
                pass  # not empty: something else put a file there meanwhile
        self._made_dirs.clear()

    def __enter__(self) -> OutputFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()  # after commit() there is nothing left to discard

    def _make_dir(self, folder: Path) -> None:
        missing = []
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        for d in reversed(missing):
            d.mkdir()
            self._made_dirs.append(d)


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return a.absolute() == b.absolute()
