"""The compiler stays light: its --help never pulls in OR-Tools or onnxruntime."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("ortools", "onnxruntime", "pandas")


def test_compiler_help_imports_no_solver_or_runtime():
    code = (
        "import sys\n"
        "from kernel_compiler.cli import main\n"
        "sys.argv = ['kpu-kernel-compiler', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "--target" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_loader_imports_the_solver_only_when_binding():
    code = (
        "import sys\n"
        "import loader, loader.cli\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
