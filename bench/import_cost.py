"""What ``import tensorflow`` costs a process, and how much of it is Keras that tfmagic never uses.

    python bench/import_cost.py [--rounds 3]

TensorFlow's ``__init__`` imports ``keras.src.optimizers`` eagerly (for SavedModel's registry), which
imports all of ``keras.src`` and, through it, matplotlib.pyplot.  Every kernel, notebook kernel and
test process that imports TensorFlow paid it until ``import tfmagic`` kept it out
(:mod:`tfmagic.kerasgate`); a task imports only the server core
(:class:`tfmagic.task.server.ServerCore`).  Each way is measured in fresh child processes,
alternating over rounds: CPU seconds (user + system), medians side by side.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys

WAYS = {
    "import tensorflow": "import tensorflow",
    "import tfmagic, tensorflow": "import tfmagic\nimport tensorflow",
    "the task's server core": "from tfmagic.task.server import ServerCore\nServerCore()",
}


def measure(code: str) -> float:
    """CPU seconds (user + system) of one child that runs ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cpu: dict[str, list[float]] = {w: [] for w in WAYS}
    for r in range(args.rounds):
        order = list(WAYS) if r % 2 == 0 else list(reversed(WAYS))
        for way in order:
            cpu[way].append(measure(WAYS[way]))
        print(f"round {r + 1}: " + ", ".join(f"{w} {cpu[w][-1]:.1f} s" for w in WAYS), flush=True)
    base = statistics.median(cpu["import tensorflow"])
    print(f"\nCPU seconds, median of {args.rounds} (each way in fresh processes, alternating)")
    for way, values in cpu.items():
        m = statistics.median(values)
        print(f"{way:32s} {m:5.2f} s   x{m / base:.2f}")


if __name__ == "__main__":
    main()
