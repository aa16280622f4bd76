"""Peak memory of each notebook: its kernel and every process below it (the cluster's tasks).

    python bench/notebook_memory.py [01 04 ...]     # all notebooks by default

Each notebook runs top to bottom in a fresh kernel, as Binder runs it (no SSH hosts, no
Spark: notebook 05 skips those parts), with ``TFMAGIC_SPARES=0``. The kernel's process tree is
sampled twice a second; memory is PSS (shared pages counted once across the processes), which
is what a container's memory limit counts more closely than RSS. Prints one row per notebook
and whether it fits Binder's guaranteed 1 GB and its 2 GB ceiling.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from tfmagic.experiments.base import MemoryWatch

ROOT = Path(__file__).resolve().parents[1]


def kernel_pid(client: NotebookClient) -> int | None:
    km = getattr(client, "km", None)
    process = getattr(getattr(km, "provisioner", None), "process", None)
    return getattr(process, "pid", None)


def measure(path: Path) -> tuple[int, float]:
    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ, TFMAGIC_SPARES="0")
    for key in ("TFMAGIC_DEMO_SSH_HOSTS", "TFMAGIC_DEMO_SSH_CONFIG", "PYTEST_CURRENT_TEST"):
        env.pop(key, None)
    client = NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    watch = MemoryWatch(every=0.5, pid=lambda: kernel_pid(client))
    t0 = time.perf_counter()
    with watch:
        client.execute(env=env)
    return watch.peak, time.perf_counter() - t0


def main() -> None:
    wanted = sys.argv[1:]
    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if wanted:
        paths = [p for p in paths if p.name[:2] in wanted]
    print(f"{'notebook':34s} {'peak PSS':>9s} {'time':>6s}  fits")
    for path in paths:
        try:
            peak, seconds = measure(path)
        except Exception as exc:  # noqa: BLE001 - a failing notebook is a row, not the end of the table
            print(f"{path.name:34s} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
            continue
        fits = "1 GB guaranteed" if peak <= 1e9 else "2 GB ceiling" if peak <= 2e9 else "NOT Binder"
        print(f"{path.name:34s} {peak / 1e9:8.2f}G {seconds:5.0f}s  {fits}", flush=True)


if __name__ == "__main__":
    main()
