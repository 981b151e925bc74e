"""Timing models of the KPU's units: each turns a task into a duration in cycles.

Every model has `cycles(task) -> int` and `tail_cycles`: the trailing part of a task during which
it no longer holds its shared resource (DRAM channel or L2 bank port), so the simulator can free
that resource early.
"""
