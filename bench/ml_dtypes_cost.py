"""What each ml_dtypes release costs a process that imports TensorFlow.

    python bench/ml_dtypes_cost.py [--versions 0.6.0 0.7.0] [--rounds 5]

TensorFlow imports ``ml_dtypes`` (bfloat16, float8 and the like) in every process: each task, each
kernel, each test process.  pyproject.toml keeps it below 0.7 because 0.7.0's extension module took
about three times the CPU of 0.6.0's to load on the machines tfmagic is tested on.  This fetches each
release's wheel from the package index (``pip download --no-deps``), unpacks it beside the installed
one, and measures fresh child processes with each first on their path, alternating over rounds:
CPU seconds (user + system) of ``import ml_dtypes`` alone and of ``import tfmagic, tensorflow``,
medians side by side.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WAYS = {
    "import ml_dtypes": "import ml_dtypes",
    "import tfmagic, tensorflow": "import tfmagic\nimport tensorflow",
}


def unpack(version: str, into: Path) -> Path:
    """ml_dtypes ``version``'s wheel for this Python, unpacked in a folder of its own."""
    wheels = into / f"wheel-{version}"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "-d",
            str(wheels),
            f"ml_dtypes=={version}",
        ],
        check=True,
    )
    site = into / f"site-{version}"
    for wheel in wheels.glob("*.whl"):
        zipfile.ZipFile(wheel).extractall(site)
    return site


def measure(code: str, site: Path) -> float:
    """CPU seconds (user + system) of one child that runs ``code`` with ``site`` first on its path."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env["PYTHONPATH"] = ":".join([str(site), *sys.path])
    subprocess.run(
        [sys.executable, "-c", code + "\nimport ml_dtypes\nprint(ml_dtypes.__version__)"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=["0.6.0", "0.7.0"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ml-dtypes-") as tmp:
        sites = {v: unpack(v, Path(tmp)) for v in args.versions}
        for v, site in sites.items():  # the version each child will import, said once
            out = subprocess.run(
                [sys.executable, "-c", "import ml_dtypes; print(ml_dtypes.__version__)"],
                env={**os.environ, "PYTHONPATH": ":".join([str(site), *sys.path])},
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            if out != v:
                raise SystemExit(f"asked for ml_dtypes {v}, the children import {out}")
        cpu = {(v, w): [] for v in args.versions for w in WAYS}
        for r in range(args.rounds):
            order = args.versions if r % 2 == 0 else list(reversed(args.versions))
            for v in order:
                for way, code in WAYS.items():
                    cpu[v, way].append(measure(code, sites[v]))
            print(
                f"round {r + 1}: " + ", ".join(f"{v} {w} {cpu[v, w][-1]:.2f} s" for v, w in cpu), flush=True
            )
    base = args.versions[0]
    print(f"\nCPU seconds, median of {args.rounds} (fresh processes, alternating)")
    for way in WAYS:
        ref = statistics.median(cpu[base, way])
        for v in args.versions:
            m = statistics.median(cpu[v, way])
            print(f"{way:28s} ml_dtypes {v:8s} {m:5.2f} s   x{m / ref:.2f} of {base}")


if __name__ == "__main__":
    main()
