"""Running a sweep's jobs: in this process (`--serial`), or on a Dask cluster, local or not.

An engine is a context manager: entering it starts or reaches the cluster (so a cluster that
cannot be used is found before any file is written), leaving it stops a local one; inside, it
is a function that runs jobs. It hands each row to `done(job, row)` the moment its point
finishes, in the order they finish; the caller appends it to the results table there and then.
On Dask each job is a
task `point.evaluate(job, model)`: the job holds the point's config document, and each model's
bytes are scattered to the cluster once and passed to every task of that workload, so no worker
ever needs a file of the client's. A point's own failure is a row (`evaluate` never raises); what
can still go wrong is the cluster's (a worker that died under a task, a lost scheduler): such a
job gets no row, so a rerun evaluates it again, and it is returned as lost.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .point import Job, evaluate

Done = Callable[[Job, dict[str, Any]], None]
Run = Callable[[list[Job], dict[str, bytes], Done], list[tuple[Job, str]]]  # (jobs, models by workload, done) -> lost
WORKER_WAIT_SECONDS = 60  # how long an external cluster may take to have a worker


class EngineError(RuntimeError):
    """The cluster cannot be used at all; str(e) is one line."""


def local_cores() -> int:
    """The cores this process may run on: one local worker process each."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def serial() -> Iterator[Run]:
    """The engine that evaluates each job here, in order: the reference the Dask engine's rows
    must equal."""

    def run(jobs: list[Job], models: dict[str, bytes], done: Done) -> list[tuple[Job, str]]:
        for job in jobs:
            done(job, evaluate(job, models[job.workload]))
        return []

    yield run


@contextmanager
def dask(scheduler: str | None = None, workers: int | None = None) -> Iterator[Run]:
    """The engine on the Dask cluster at `scheduler`, or on a local cluster of `workers` processes
    (default: one per core) started here and stopped on leaving. It runs the jobs it is given
    and returns those lost with the reason."""
    with _client(scheduler, workers) as client:
        yield lambda jobs, models, done: _run(client, jobs, models, done)


def _run(client: Any, jobs: list[Job], models: dict[str, bytes], done: Done) -> list[tuple[Job, str]]:
    from dask.distributed import as_completed

    lost: list[tuple[Job, str]] = []
    data = {name: client.scatter(blob, hash=False) for name, blob in models.items()}
    futures = {client.submit(evaluate, job, data[job.workload], key=f"kpu-dse-{job.key}", retries=0): job
               for job in jobs}
    for future in as_completed(futures):
        job = futures[future]
        try:
            row = future.result()
        except Exception as e:  # the cluster's failure: evaluate() itself never raises
            lost.append((job, " ".join(f"{type(e).__name__}: {e}".splitlines())))
            continue
        finally:
            future.release()  # the row is here: the cluster may forget it
        done(job, row)
    return lost


@contextmanager
def _client(scheduler: str | None, workers: int | None) -> Iterator[Any]:
    """A Dask client on the cluster at `scheduler`, or on a local cluster made for this sweep."""
    import importlib
    import tempfile

    import dask
    from dask.distributed import Client, LocalCluster

    # the cluster's own chatter (connection closed at shutdown, GC pauses) is not the sweep's
    # output; its errors still show
    logging.getLogger("distributed").setLevel(logging.ERROR)
    if scheduler is None:
        # Each Dask server (scheduler, nannies, workers) makes a scratch space under the
        # `temporary-directory`, and leaves it there: here a folder of this sweep's own, removed
        # once the cluster is down.
        with (tempfile.TemporaryDirectory(prefix="kpu-dse-") as scratch,
              dask.config.set({"temporary-directory": scratch}),
              LocalCluster(n_workers=workers or local_cores(), threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=logging.ERROR) as cluster,
              Client(cluster) as client):
            yield client
        return
    try:
        client = Client(scheduler, timeout="10s")
    except (OSError, TimeoutError, ValueError) as e:
        raise EngineError(f"--scheduler {scheduler}: cannot connect: {e}") from None
    with client:
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT_SECONDS)
            # a worker without the toolchain would fail every task the same way: find out once
            client.run(importlib.import_module, "dse.point")
        except TimeoutError:
            raise EngineError(f"--scheduler {scheduler}: no worker joined within {WORKER_WAIT_SECONDS} s; "
                              "start some with `dask worker " + scheduler + "`") from None
        except ImportError as e:
            raise EngineError(f"--scheduler {scheduler}: a worker cannot import the toolchain ({e}); install "
                              "kpu-toolchain where the workers run") from None
        yield client
