"""Where a command's CPU goes, by kind of process: ``python tests/cpu_by_process.py -- bash .ci/run``.

``tests/durations.py`` reads pytest's JUnit XML, which knows each test's wall time and only the CPU
its test process spent or reaped: a task, kernel or browser that a fixture ended by SIGKILL is never
reaped by the test and its CPU is nowhere. This samples every process of the machine once a
second (``/proc/PID/stat``: user + system time, so a process that lives under a second may be
missed and each one's last second is lost) while the command runs, sorts them by what their command
line says they are (a tfmagic task, a kernel, Chromium, ...), and prints the CPU seconds of each
kind, then by the test file whose test started them (the ``PYTEST_CURRENT_TEST`` they inherited).
Processes already running when it starts count only what they spend afterwards. Everything
on the machine is counted (run it on a quiet one).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

#: (what a command line contains, the kind it is), first match wins
KINDS = (
    ("tfmagic.task_main", "tfmagic task"),
    ("tfmagic.procs.tree", "task keeper"),
    ("tfmagic.network.relay", "relay"),
    ("ipykernel_launcher", "kernel"),
    ("chrom", "chromium"),
    ("configurable-http-proxy", "hub proxy (node)"),
    ("jupyterhub", "jupyterhub"),
    ("tfmagic.hub", "jupyterhub"),
    ("jupyter", "jupyter server"),
    ("voila", "jupyter server"),
    ("tensorboard", "tensorboard"),
    ("java", "spark (jvm)"),
    ("pyspark", "spark (python)"),
    ("slurm", "slurm"),
    ("munged", "slurm"),
    ("sshd", "ssh"),
    ("playwright", "playwright driver"),
    ("exec(eval(sys.stdin", "pytest worker (xdist)"),
    ("pytest", "pytest"),
    ("-m pip ", "installers"),
    ("bin/pip ", "installers"),
    ("bin/uv ", "installers"),
)


def kind(cmdline: str) -> str:
    for mark, name in KINDS:
        if mark in cmdline:
            return name
    return "other python" if "python" in cmdline.split(" ")[0] else "other"


def sample(seen: dict, ticks: int) -> None:
    """Read every process's CPU time into ``seen`` (keyed by pid and start time: pids are reused)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat.rpartition(b")")[2].split()
        cpu = (int(fields[11]) + int(fields[12])) / ticks
        key = (name, fields[19])
        if key in seen:
            seen[key][1] = cpu
            seen[key][5] = min(seen[key][5], int(fields[16]))  # the lowest it ran at
        elif cmd:
            # kind, now, at first sight, test, niceness, lane
            seen[key] = [kind(cmd), cpu, cpu, *test_of(name), int(fields[16])]


def test_of(pid: str) -> tuple[str, str]:
    """The test file whose test started ``pid`` and its lane (tests/conftest.py's ``@timed``, ``@rest``):
    pytest sets PYTEST_CURRENT_TEST, children inherit it.

    A process started by a session fixture or a warm pool counts for the test that was running when
    it was spawned; one started outside a test (the lint, the installers, or a daemon's child: sshd's
    sessions, slurmd's jobs) counts as "-".
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return "-", "-"
    for entry in env:
        # kernels get the test's name as TFMAGIC_TEST_STARTED_BY (ipykernel changes its output when it
        # sees PYTEST_CURRENT_TEST, so the tests' kernel starters take that one out)
        name, _, value = entry.partition(b"=")
        if name in (b"PYTEST_CURRENT_TEST", b"TFMAGIC_TEST_STARTED_BY") and value:
            test = value.decode(errors="replace").split(" ")[0]
            lane = test.rpartition("@")[2] if "@" in test else "-"
            return test.split("::")[0].rpartition("/")[2], lane
    return "-", "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--top", type=int, default=25, help="the test files to list")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    ticks = os.sysconf("SC_CLK_TCK")
    seen: dict = {}
    sample(seen, ticks)
    before = set(seen)
    started = time.monotonic()
    child = subprocess.Popen(command)
    while child.poll() is None:
        time.sleep(1.0)
        sample(seen, ticks)
    wall = time.monotonic() - started
    cpu: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    by_file: collections.Counter = collections.Counter()
    tasks_by_file: collections.Counter = collections.Counter()
    kinds_by_file: dict = collections.defaultdict(collections.Counter)
    # CPU the timed lane competes with at its own priority: anything not of that lane that ran at a
    # niceness under the rest lane's (a daemon's child, a browser that raised itself, the installers)
    unniced: collections.Counter = collections.Counter()
    for key, (name, now, first, where, lane, nice) in seen.items():
        spent = now - first if key in before else now
        if lane != "timed" and nice < 19 and name not in ("pytest", "pytest worker (xdist)"):
            unniced[(name, where, nice)] += spent
        cpu[name] += spent
        count[name] += key not in before
        by_file[where] += spent
        kinds_by_file[where][name] += spent
        if name == "tfmagic task":
            tasks_by_file[where] += key not in before
    total = sum(cpu.values())
    print(
        f"{command[0]}... exit {child.returncode}: {wall:.0f} s wall, {total:.0f} CPU-s "
        f"({total / wall:.2f} cores on average)"
    )
    print(f"{'kind':24s} {'started':>8s} {'CPU-s':>8s} {'share':>6s}")
    for name, spent in cpu.most_common():
        if spent >= 0.5:
            print(f"{name:24s} {count[name]:8d} {spent:8.0f} {spent / total:6.0%}")
    print(f"\n{'started by tests in':32s} {'tasks':>6s} {'CPU-s':>8s} {'share':>6s}  of which")
    for where, spent in by_file.most_common(args.top):
        parts = ", ".join(f"{k} {v:.0f}" for k, v in kinds_by_file[where].most_common(3) if v >= 1)
        print(f"{where:32s} {tasks_by_file[where]:6d} {spent:8.0f} {spent / total:6.0%}  {parts}")
    print("\nCPU beside the timed lane at a niceness under 19 (kind, started by, niceness)")
    for (name, where, nice), spent in unniced.most_common(args.top):
        if spent >= 1:
            print(f"  {name:24s} {where:32s} {nice:4d} {spent:8.0f}")
    if args.json:
        figures = {"wall": wall, "cpu": dict(cpu), "started": dict(count), "by_file": dict(by_file)}
        figures["tasks_by_file"] = dict(tasks_by_file)
        figures["kinds_by_file"] = {k: dict(v) for k, v in kinds_by_file.items()}
        figures["unniced"] = [[*k, v] for k, v in unniced.most_common() if v >= 1]
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
