"""How both tools write files: all of a run's outputs appear together, or none does.

`OutputFiles` is one run's set of output files. `claim` checks each path before any work
(its nearest existing folder is a folder, nothing but a regular file or a link is in the way, it is not one of the
run's own inputs, no two outputs share it). `stage` writes a file's bytes to a private temp file
in the target folder, created exclusively, so no existing file, link or FIFO is ever opened or
followed. `commit` renames every staged file into place once the whole run has succeeded; a
rename replaces a link at the path, never its target. All or nothing: every path is checked
again just before the first rename (a folder may have appeared during the run), what each path
holds is kept under a second name until all renames are done, and if one fails the earlier ones
are undone. On any failure the temp files go and the paths keep what they held before. Messages
name the user's path, never a temp file.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable
from contextlib import suppress
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
        if not os.fspath(path):  # Path("") is the current folder
            raise OutputError("an empty output path; name a file")
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
        _check_nothing_in_the_way(path)
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
        """Every staged file into place, or none: see the module doc."""
        for _, path in self._staged:
            _check_nothing_in_the_way(path)
        kept: list[Path | None] = []  # per staged file, the second name of what its path held
        try:
            for _, path in self._staged:
                kept.append(_keep(path))
        except OSError as e:
            _remove(kept)
            raise OutputError(f"{path}: cannot write: {e.strerror}") from None
        done = 0
        try:
            for tmp, path in self._staged:
                os.replace(tmp, path)
                done += 1
        except OSError as e:
            for (_, earlier), previous in reversed(list(zip(self._staged[:done], kept))):
                with suppress(OSError):  # best effort: each path is put back on its own
                    if previous is None:
                        earlier.unlink()
                    else:
                        os.replace(previous, earlier)
            _remove(kept)
            raise OutputError(f"{path}: cannot write: {e.strerror}") from None
        _remove(kept)
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


def _check_nothing_in_the_way(path: Path) -> None:
    """OutputError unless `path` is free, a regular file or a link (replaced, never followed)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise OutputError(f"{path}: cannot write: {e.strerror}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise OutputError(f"{path}: cannot write: {what} is in the way")


def _keep(path: Path) -> Path | None:
    """A second name (a hard link, or a copy where the file system has none) for the file or link
    at `path`, so that it can be put back after it is replaced; None when nothing is there."""
    if not os.path.lexists(path):
        return None
    while True:
        kept = path.with_name(f".{path.name[:64]}.{secrets.token_hex(8)}.previous")
        try:
            os.link(path, kept, follow_symlinks=False)  # a link at `path` is kept as a link
        except FileExistsError:
            continue
        except OSError:
            if path.is_symlink():
                os.symlink(os.readlink(path), kept)
            else:
                shutil.copy2(path, kept)
        return kept


def _remove(kept: list[Path | None]) -> None:
    for k in kept:
        if k is not None:
            with suppress(OSError):
                k.unlink()


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return a.absolute() == b.absolute()
