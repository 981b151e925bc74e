"""Package exports resolved on first use, so a command line parses its arguments (and prints
--help) before numpy, OR-Tools or the simulator load."""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_exports(package: str, modules: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: each exported name (a key of `modules`) from its
    submodule, imported when the name is first asked for."""

    def attribute(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        return getattr(import_module(f".{modules[name]}", package), name)

    return attribute
