"""The CLIs stay light: --help of either loads neither OR-Tools, the simulator nor numpy, and the
loader imports the solver only when it binds."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("ortools", "onnxruntime", "pandas", "numpy", "hardware.simulator")


def _heavy_modules() -> str:
    return f"print(sorted(m for m in sys.modules if m in {HEAVY!r} or m.split('.')[0] in {HEAVY!r}))\n"


@pytest.mark.parametrize("module, tool, option", [("kernel_compiler", "kpu-kernel-compiler", "--target"),
                                                  ("loader", "kpu-loader", "--no-cache")])
def test_help_imports_no_solver_simulator_or_numpy(module, tool, option):
    code = (
        "import sys\n"
        f"from {module}.cli import main\n"
        f"sys.argv = [{tool!r}, '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        + _heavy_modules()
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert option in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_loader_imports_the_solver_only_when_binding():
    code = "import sys\nimport loader, loader.cli\n" + _heavy_modules()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
