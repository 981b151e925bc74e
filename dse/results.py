"""The results table, `OUTDIR/results.csv`: one row per (point, workload).

Columns: `point` (the row's key: a digest of the point's whole machine, the model's bytes, the
compile and bind options and the toolchain's code, so a changed base config, model or toolchain
is evaluated anew), one column per axis (its value as the spec gives it), `workload`, then
`point.MEASURES`. Every cell is one line of text (None is empty, floats as Python writes them
back exactly), so every row is one line.

A sweep appends each row and flushes it the moment its point finishes: a sweep killed at any
moment loses only the points in flight, and at worst leaves the last row half written, which the
next run cuts off before it appends, saying so. A last row without its line end that is whole
(every column, a status and measures kpu-dse writes: an editor dropped the line end) is kept and
given its line end before rows are appended; a kill inside its last cell (a wall-clock time) cannot
be told from it. The rows already there are the points a rerun skips; a file with other columns
is another sweep's and is refused, not appended to, and so is a file with a whole row kpu-dse
cannot have written (a status other than ok or failed, a measurement that is not a finite
number). At the end of a sweep the file is rewritten in the spec's order (each row's
line as it was), so a finished sweep's table does not depend on the order in which the workers
finished.

The file is read and appended to in place, so it must be a regular file of OUTDIR and its only
name: a symbolic link (dangling or not), a file with other hard links, or anything else at its
path is refused before any work, and neither reading nor appending ever follows a link, so no
file outside OUTDIR is read, changed or made. Only text after a whole header line of this sweep
is ever cut off: a file whose first line has no line end (a partial header, or something else)
is refused as not ours. A BOM at its start (as a spreadsheet saving it writes) and blank lines at
its end are ignored; the blank lines are cut off before rows are appended.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Iterable

from dfx import size_words

from .point import MEASURES, NUMBERS, STATUSES

# A sweep has at most spec.MAX_ROWS rows of a few hundred bytes; a table also keeps the rows of
# earlier specs. It is read whole, and held with each row parsed: bounded before it is read.
MAX_RESULTS_BYTES = 256 * 1024 * 1024


class ResultsError(ValueError):
    """A results file this sweep cannot use; str(e) is one line naming it."""


def key_columns(axes: Iterable[str]) -> tuple[str, ...]:
    """What identifies a row, and shows which point and workload it is."""
    return ("point", *axes, "workload")


def columns(axes: Iterable[str]) -> tuple[str, ...]:
    return (*key_columns(axes), *MEASURES)


def cell(value: Any) -> str:
    """A value as its table cell: one line, the same text for the same value on any run."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # a float's shortest text that reads back as the same float
    if isinstance(value, str):
        return " ".join(value.splitlines())
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def line(values: Iterable[str]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(values)
    return out.getvalue()


class Table:
    """The results file of one sweep: `read` the rows it has, `start` appending, `append` each row."""

    def __init__(self, path: Path, header: tuple[str, ...]):
        self.path, self.header = path, header
        self.lines: dict[str, str] = {}  # key -> its row's line, as in the file
        self.rows: dict[str, dict[str, str]] = {}  # key -> its row's cells by column
        self._complete = 0  # bytes of the file up to its last whole row
        self._unended = False  # the last whole row has no line end: start() adds it
        self.cut: str | None = None  # what start() cuts off, as a warning naming the file and line
        self._file: io.TextIOWrapper | None = None

    def read(self) -> None:
        """Read the rows already in the file (none if there is no file); nothing is written yet."""
        data = self._read_bytes()
        self._complete = data.rfind(b"\n") + 1
        last = data[self._complete:]
        if last.strip() and self._complete:  # after a whole line: a whole row, or one a kill cut short
            if self._whole_row(last):
                self._complete, self._unended = len(data), True
            else:
                number = data.count(b"\n") + 1
                self.cut = (f"{self.path}: line {number}: {_clip(last.decode('utf-8', 'replace'))!r}: a row left half "
                            "written (a sweep killed while writing it), cut off; its point is evaluated again")
        # blank lines at the end (an editor's or a hand's) are no rows: start() cuts them off too
        whole = data[: self._complete].splitlines(keepends=True)
        while whole and not whole[-1].strip():
            self._complete -= len(whole.pop())
        try:
            text = data[: self._complete].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ResultsError(f"{self.path}: byte {e.start}: not UTF-8 text, not a kpu-dse results table") from None
        text = text.removeprefix("\ufeff")  # a BOM, as a spreadsheet saving the table writes it
        if self._unended:
            text += "\n"  # the line end start() gives it
        lines = text.splitlines(keepends=True)
        if not lines and data.strip():
            # only what follows our whole header line can be a row a kill cut short: text with no
            # header line is not ours to cut off
            shown = data[:60].decode("utf-8", "replace").removeprefix("\ufeff")
            raise ResultsError(f"{self.path}: line 1: {_clip(shown)!r}: no whole header line, so not a kpu-dse "
                               "results table (kpu-dse writes its header line whole); choose another -o folder or "
                               "remove the file")
        if lines:
            header = self._cells(1, lines[0])
            if tuple(header) != self.header:
                raise ResultsError(f"{self.path}: line 1: columns {_clip(','.join(header))} are another sweep's, "
                                   f"this one writes {','.join(self.header)}; choose another -o folder or remove "
                                   "the file")
        for number, text_line in enumerate(lines[1:], start=2):
            values = self._cells(number, text_line)
            if len(values) != len(self.header):
                raise ResultsError(f"{self.path}: line {number}: {len(values)} cells, the header has "
                                   f"{len(self.header)}; the file was edited, not written by kpu-dse")
            self._check(number, dict(zip(self.header, values)))
            self.lines.setdefault(values[0], text_line)
            self.rows.setdefault(values[0], dict(zip(self.header, values)))

    def _whole_row(self, data: bytes) -> bool:
        """Whether `data` (a last line without its line end) is a whole row kpu-dse writes."""
        try:
            values = self._cells(0, data.decode("utf-8"))
            if len(values) != len(self.header):
                return False
            self._check(0, dict(zip(self.header, values)))
        except (UnicodeDecodeError, ResultsError):
            return False
        return True

    def _cells(self, number: int, text_line: str) -> list[str]:
        try:
            return next(csv.reader([text_line]))
        except csv.Error as e:  # a cell past the csv module's limit: no table kpu-dse writes
            raise ResultsError(f"{self.path}: line {number}: {e}; the file was edited, not written by "
                               "kpu-dse") from None

    def _open(self, flags: int) -> int:
        """A descriptor of the file at the path, never through a link; ResultsError if a link or
        anything but a regular file is there."""
        try:
            mode = self.path.lstat().st_mode
        except FileNotFoundError:
            mode = None
        what = None
        if mode is not None and not stat.S_ISREG(mode):
            what = "is a symbolic link" if stat.S_ISLNK(mode) else "is not a regular file"
        else:
            try:  # O_NOFOLLOW and O_NONBLOCK: a link or a FIFO put there since is refused, not opened
                fd = os.open(self.path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENXIO):
                    raise
                what = "is a symbolic link" if e.errno == errno.ELOOP else "is not a regular file"
            else:
                info = os.fstat(fd)
                # a hard link is another name of the same file: appending would change a file
                # outside OUTDIR, or one another program reads
                if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                    os.set_blocking(fd, True)
                    return fd
                os.close(fd)
                what = (f"has {info.st_nlink} hard links (other names of the same file)" if stat.S_ISREG(info.st_mode)
                        else "is not a regular file")
        raise ResultsError(f"{self.path}: {what}; kpu-dse reads and appends to its results table in place and "
                           "never through a link: remove it or choose another -o folder")

    def _read_bytes(self) -> bytes:
        """The file's bytes, read as dfx.read_input_file reads (a regular file, its size bounded
        before reading), but never through a link: the table is ours only at this path."""
        if not os.path.lexists(self.path):
            return b""
        try:
            fd = self._open(os.O_RDONLY)
            with os.fdopen(fd, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size <= MAX_RESULTS_BYTES:
                    # what it holds and one more byte, to see it grew (read(n) sets n bytes aside first)
                    data = f.read(size + 1)
                    size = len(data)
        except FileNotFoundError:
            return b""
        except OSError as e:
            raise ResultsError(f"{self.path}: cannot read: {e.strerror or e}") from None
        if size > MAX_RESULTS_BYTES:
            raise ResultsError(f"{self.path}: {size_words(size)}, larger than the {size_words(MAX_RESULTS_BYTES)} a "
                               "results table may be; choose another -o folder")
        return data

    def _check(self, number: int, row: dict[str, str]) -> None:
        """A whole row must be one kpu-dse wrote: a known status, and each measurement empty or a
        finite number. A row that is not is refused, not evaluated again: only a hand (or another
        program) makes one, and a rerun that quietly replaced it would hide that its file is not
        what the sweep wrote; the user fixes or removes the row, or chooses another -o folder.
        (A half-written last row is a kill's doing, never checked here: start() cuts it off.)"""
        status = row["status"]
        if status not in STATUSES:
            raise ResultsError(f"{self.path}: line {number}: status: {_clip(status)!r} is not "
                               f"{' or '.join(STATUSES)}; the file was edited, not written by kpu-dse")
        for column in NUMBERS:
            text = row[column]
            try:
                ok = text == "" or math.isfinite(float(text))  # nan and inf measure nothing
            except ValueError:
                ok = False
            if not ok:
                raise ResultsError(f"{self.path}: line {number}: {column}: {_clip(text)!r} is not a finite number; "
                                   "the file was edited, not written by kpu-dse")

    def start(self) -> None:
        """Cut off a half-written last row and open the file for appending, with the header if it
        has none, and the line end of its last row if that has none."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = self._open(os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # made if missing, never through a link
            os.ftruncate(fd, self._complete)
            self._file = open(fd, "a", encoding="utf-8", newline="")
            if not self._complete or self._unended:
                self._file.write("\n" if self._unended else line(self.header))
                self._file.flush()
                self._unended = False
        except OSError as e:
            raise ResultsError(f"{self.path}: cannot write: {e.strerror or e}") from None

    def append(self, row: dict[str, Any]) -> None:
        """Add a row and flush it: from here on a kill cannot lose it."""
        cells = [cell(row[c]) for c in self.header]
        text = line(cells)
        assert self._file is not None
        try:
            self._file.write(text)
            self._file.flush()
        except OSError as e:
            raise ResultsError(f"{self.path}: cannot write: {e.strerror or e}") from None
        self.lines[cells[0]] = text
        self.rows[cells[0]] = dict(zip(self.header, cells))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def ordered(self, keys: list[str]) -> bytes:
        """The whole file with the rows of `keys` first, in that order, then any other rows it
        holds (points of an earlier spec), each line as it was written."""
        wanted = set(keys)
        rest = [k for k in self.lines if k not in wanted]
        return (line(self.header) + "".join(self.lines[k] for k in [*keys, *rest] if k in self.lines)).encode()


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
