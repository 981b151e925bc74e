"""What the command-line tools share: every error is one line on stderr and exit code 2, and
one way of printing their messages and tables."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

# off a terminal a table is as wide as its cells need, up to this: never cut to the 80 columns
# rich assumes there
LOG_WIDTH = 1000


def cli_console(stderr: bool = True) -> Any:
    """The rich console a command line prints on (stderr, or stdout). On a terminal: its width,
    and colour unless NO_COLOR is set. Off one (a pipe, a file, a CI log) or on TERM=dumb: no
    escape codes, every message on one line whatever its length, and each table as wide as it
    needs, so a log holds no message cut in two."""
    from rich.console import Console

    probe = Console(stderr=stderr)
    if probe.is_terminal and not probe.is_dumb_terminal:
        return Console(stderr=stderr, color_system=None if os.environ.get("NO_COLOR") else "auto")
    return Console(stderr=stderr, width=LOG_WIDTH, soft_wrap=True, color_system=None, force_terminal=False)


def fail(message: str) -> NoReturn:
    # one line whatever the message quotes from the input (a name may hold a line break)
    print("error: " + " ".join(message.splitlines()), file=sys.stderr)
    raise SystemExit(2)


def run_command(app: Any) -> NoReturn:
    """Run the typer `app` and exit with its code; a usage error (unknown option, value out of
    range) is one line like any other error, not a usage block and a panel."""
    import warnings

    from typer import Abort
    from typer.exceptions import TyperException

    # numpy's warnings on the values a run computes (NaN from a negative variance, inf from an
    # overflow) are the data's, not messages: they would be lines of source on stderr, and --check
    # reports what is wrong with the values
    warnings.simplefilter("ignore", RuntimeWarning)
    try:
        code = app(standalone_mode=False)
    except TyperException as e:
        fail(e.format_message())
    except Abort:  # ^C or end of input at a prompt
        code = 130
    sys.exit(code or 0)
