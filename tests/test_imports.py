"""The CLIs stay light: --help of any of the three loads neither OR-Tools, the simulator, numpy, onnx,
Dask nor matplotlib, the loader imports the solver only when it binds, and a run on a valid f32
object and a JSON config loads none of jsonschema (it words refusals), ml_dtypes (bf16 and f8),
PyYAML and matplotlib (only --plot draws)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import CONFIGS, gemm_dfg, run_cli

HEAVY = ("ortools", "onnx", "onnxruntime", "pandas", "numpy", "hardware.simulator", "matplotlib", "dask",
         "distributed")


def _heavy_modules() -> str:
    return f"print(sorted(m for m in sys.modules if m in {HEAVY!r} or m.split('.')[0] in {HEAVY!r}))\n"


@pytest.mark.parametrize("module, tool, option", [("kernel_compiler", "kpu-kernel-compiler", "--target"),
                                                  ("loader", "kpu-loader", "--no-cache"),
                                                  ("dse", "kpu-dse", "--scheduler")])
def test_help_imports_no_solver_simulator_numpy_or_onnx(module, tool, option):
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


def test_a_valid_object_with_a_json_config_runs_without_jsonschema_ml_dtypes_yaml_or_matplotlib(tmp_path):
    (tmp_path / "g.dfg").write_text(gemm_dfg(64, 64, 64))
    assert run_cli("compiler", tmp_path / "g.dfg", "-o", tmp_path / "g.kpu").returncode == 0
    args = [str(tmp_path / "g.kpu"), "--config", str(CONFIGS / "standard.json"), "--check", "--binder", "greedy"]
    unused = ("jsonschema", "ml_dtypes", "yaml", "matplotlib")
    code = (
        "import sys\n"
        "from loader.cli import main\n"
        f"sys.argv = ['kpu-loader', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {unused!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout
