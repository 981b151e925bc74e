"""The binders by the names `--binder` and sweep specs give them. CP-SAT's module imports
OR-Tools, so only a run that binds with it (no cached bindings) loads it."""

from __future__ import annotations

BINDERS = ("cp-sat", "greedy")


def binder_named(name: str):
    """The binder function of `name`, one of BINDERS."""
    if name == "cp-sat":
        from .bind import bind_cpsat

        return bind_cpsat
    from .binding import bind_greedy

    return bind_greedy
