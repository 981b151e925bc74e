"""Shared helpers: run the CLIs as a user would, and build small programs in-process."""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import subprocess
import sys
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

# One BLAS thread per process, set before numpy loads: the suite already runs a process per core
# (pytest-xdist's workers, and the CLIs and Dask workers its tests start), so OpenBLAS's threads
# would only contend for those cores, spinning while they wait (a convolution's matmuls took up to
# ten times as long). The numbers do not change: MobileNet's outputs and checks are the same bits.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# `make test` (profile "ci") draws the same examples every run, so CI passes or fails on the code,
# never on the draw. `make fuzz` (profile "fuzz") draws fresh examples, twenty times as many.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("fuzz", derandomize=False, deadline=None)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)


def examples(n: int) -> int:
    """How many examples a property test draws: n under `make test`, 20n under `make fuzz`."""
    return n * (20 if PROFILE == "fuzz" else 1)


ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
CONFIGS = ROOT / "configs"

_spec = importlib.util.spec_from_file_location("make_gemm", ROOT / "examples" / "make_gemm.py")
make_gemm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_gemm)
gemm_dfg = make_gemm.gemm_dfg


PROGRAMS = {"compiler": ("kpu-kernel-compiler", "kernel_compiler"), "loader": ("kpu-loader", "loader"),
            "dse": ("kpu-dse", "dse")}
DEADLINE_SECONDS = 300


class DeadlinePassed(BaseException):
    """Raised into a tool run in-process that outlived its deadline: a BaseException, so no
    handler of the tool's own can take it for one of its errors."""


def _deadline_passed(signum, frame):
    raise DeadlinePassed


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(warnings.formatwarning(message, category, filename, lineno, line), end="", file=sys.stderr)


def run_cli(tool: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `kpu-kernel-compiler` (tool="compiler"), `kpu-loader` (tool="loader") or `kpu-dse`
    (tool="dse") as its console script runs it, but in this process: the same entry point on the
    same arguments, its exit code, stdout and stderr (a traceback as a process would print it, with
    exit code 1), without a new interpreter's second of imports per run. A deadline fails a test
    whose input makes a tool hang instead of stalling the suite. `run_cli_process` runs the real
    process, for the tests of what only a process shows."""
    import signal
    import traceback
    from contextlib import redirect_stderr, redirect_stdout
    from io import StringIO

    program, module = PROGRAMS[tool]
    main = importlib.import_module(f"{module}.cli").main
    out, err = StringIO(), StringIO()
    argv, here = sys.argv, os.getcwd()
    previous = signal.signal(signal.SIGALRM, _deadline_passed)
    signal.alarm(DEADLINE_SECONDS)
    try:
        sys.argv = [program, *map(str, args)]
        if cwd is not None:
            os.chdir(cwd)
        # a Python warning reaches stderr, as a process prints it (not pytest's record), every time
        with redirect_stdout(out), redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = _print_warning
            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if not isinstance(e.code, int | None):
                    print(e.code, file=sys.stderr)
            except DeadlinePassed:
                pytest.fail(f"{program} {' '.join(map(str, args))}: still running after {DEADLINE_SECONDS} s")
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(here)
        sys.argv = argv
    return subprocess.CompletedProcess([program, *map(str, args)], code, out.getvalue(), err.getvalue())


def run_cli_process(tool: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`run_cli` in a process of its own, with the same deadline."""
    return subprocess.run([sys.executable, "-m", PROGRAMS[tool][1], *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=DEADLINE_SECONDS)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit 2, exactly one line on stderr, no traceback, naming each fragment."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [l for l in proc.stderr.splitlines() if l.strip() and not l.startswith("warning:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


# The longest tests are handed out first, so the workers finish together instead of one of them
# taking a minute-long test last while the others wait.
LONGEST_FIRST = ("test_readme_tour.py", "test_corpus.py::test_corpus_convolution", "test_fuzz_dfg.py",
                 "test_dse.py::test_a_killed_sweep", "test_dse.py::test_a_local_dask_cluster",
                 "test_frontend_hlo.py::test_corpus_compiles")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        return next((i for i, name in enumerate(LONGEST_FIRST) if item.nodeid.startswith(f"tests/{name}")),
                    len(LONGEST_FIRST))

    items.sort(key=rank)


def pytest_collection_finish(session):
    """What collection made (the test modules, their tables and cases) lives to the end of the
    session: frozen, it is skipped by the garbage collector's full passes, which a test building
    a large graph sets off again and again, each one walking every object the process holds."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def binding_cache_dir(tmp_path_factory):
    """The loader's binding cache of the whole session, in a temp dir: never the user's. Set in
    os.environ, so the CLIs the tests start use it too."""
    path = tmp_path_factory.mktemp("binding-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KPU_CACHE_DIR", str(path))
        yield path


def shrunk_config(tmp_path_factory, base: str, name: str, l3: tuple[int, int], l2: tuple[int, int],
                  l1: tuple[int, int]) -> str:
    """A shipped config with other on-chip memories, each (count, KB), written under `name`."""
    config = json.loads((CONFIGS / f"{base}.json").read_text())
    config["name"] = name
    config["on_chip_memory"] = {"l3": {"tile_count": l3[0], "tile_capacity_kb": l3[1]},
                                "l2": {"bank_count": l2[0], "bank_capacity_kb": l2[1]},
                                "l1": {"buffer_count": l1[0], "buffer_capacity_kb": l1[1]}}
    path = tmp_path_factory.mktemp("configs") / f"{name}.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> str:
    """The minimal config with 4 KB of L3 and 1 KB banks at L2 and L1."""
    return shrunk_config(tmp_path_factory, "minimal", "tiny", (1, 4), (4, 1), (4, 1))


def config_error(tmp_path: Path, document: dict) -> str:
    """The one-line ConfigError that loading `document` as a .json file gives."""
    from hardware import ConfigError, load_machine

    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as info:
        load_machine(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message


@pytest.fixture
def gemm_file(tmp_path):
    def make(M: int, N: int, K: int, dtype: str = "f32") -> Path:
        path = tmp_path / f"gemm_{M}x{N}x{K}_{dtype}.dfg"
        path.write_text(gemm_dfg(M, N, K, dtype))
        return path

    return make


@contextmanager
def fifo(path: Path, seconds: float = 10):
    """A FIFO at `path` that no one writes. A reader that blocks on it is released after `seconds`
    (the write end opened and closed: it reads nothing), so a test of it fails instead of hanging."""
    os.mkfifo(path)
    done = threading.Event()

    def release() -> None:
        if not done.wait(seconds):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader: nothing blocks
                pass

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        done.set()
        thread.join()
