"""What both command-line tools share: every error is one line on stderr and exit code 2."""

from __future__ import annotations

import sys
from typing import Any, NoReturn


def fail(message: str) -> NoReturn:
    # one line whatever the message quotes from the input (a name may hold a line break)
    print("error: " + " ".join(message.splitlines()), file=sys.stderr)
    raise SystemExit(2)


def run_command(app: Any) -> NoReturn:
    """Run the typer `app` and exit with its code; a usage error (unknown option, value out of
    range) is one line like any other error, not a usage block and a panel."""
    from typer import Abort
    from typer.exceptions import TyperException

    try:
        code = app(standalone_mode=False)
    except TyperException as e:
        fail(e.format_message())
    except Abort:  # ^C or end of input at a prompt
        code = 130
    sys.exit(code or 0)
