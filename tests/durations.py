"""Where CI's time goes: a pytest JUnit XML summed per tier and per file.

    python -m pytest --junitxml=/tmp/run.xml        # a full run (or any part of it)
    python tests/durations.py /tmp/run.xml [--top 15]

A test counts in its heaviest tier (notebook > browser > server > soak > kernel > cluster > unit),
the order ``tests/README.md`` budgets them in. Times include each test's fixtures' set-up and
tear-down, as JUnit records them. CPU seconds (``tests/conftest.py`` records them as the ``cpu_s``
property: the test process and the processes it reaped) show what lanes could gain: on two cores a
tier that uses 1.4 cores gains little from running beside another.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVIEST_FIRST = ("notebook", "browser", "server", "soak", "kernel", "cluster", "unit")


def node_ids(marker: str) -> set[str]:
    """The test ids ``-m marker`` selects (collection only: nothing runs)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-n",
            "0",
            "-m",
            marker,
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    return {line.strip() for line in out.splitlines() if "::" in line}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", type=Path)
    parser.add_argument("--top", type=int, default=15, help="the slowest files and tests to list")
    args = parser.parse_args()
    times: dict[str, float] = {}
    cpu: dict[str, float] = {}
    lane_of: dict[str, str] = {}
    for case in ET.parse(args.xml).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        name, _, lane = case.get("name", "").partition("@")  # the xdist lane (group) after the @
        nid = f"{path}::{name}"
        lane_of[nid] = lane or "-"
        times[nid] = float(case.get("time", 0))
        for prop in case.iter("property"):
            if prop.get("name") == "cpu_s":
                cpu[nid] = float(prop.get("value"))
    tier_of: dict[str, str] = {}
    for tier in reversed(HEAVIEST_FIRST):  # heavier tiers overwrite lighter ones
        for nid in node_ids(tier):
            tier_of[nid] = tier
    per_tier: dict[str, list[float]] = defaultdict(list)
    per_file: dict[str, float] = defaultdict(float)
    for nid, seconds in times.items():
        per_tier[tier_of.get(nid, "?")].append(seconds)
        per_file[nid.split("::")[0]] += seconds
    total = sum(times.values())
    print(f"{len(times)} tests, {total:.0f} s in all")
    cpu_of = defaultdict(float)
    for nid, seconds in cpu.items():
        cpu_of[tier_of.get(nid, "?")] += seconds
    print(f"{'tier':10s} {'tests':>6s} {'seconds':>8s} {'share':>6s} {'CPU s':>7s} {'cores':>6s}")
    for tier in (*HEAVIEST_FIRST, "?"):
        if per_tier.get(tier):
            s = sum(per_tier[tier])
            used = f"{cpu_of[tier]:7.0f} {cpu_of[tier] / s:6.2f}" if cpu and s else ""
            print(f"{tier:10s} {len(per_tier[tier]):6d} {s:8.0f} {s / total:6.0%} {used}")
    if cpu:
        print(f"all CPU: {sum(cpu.values()):.0f} s, {sum(cpu.values()) / total:.2f} cores on average")
    print(
        f"\n{'lane':10s} {'tests':>6s} {'seconds':>8s} {'CPU s':>7s} {'cores':>6s}  (the longest lane ends the run)"
    )
    for lane in sorted(set(lane_of.values())):
        ids = [nid for nid in times if lane_of[nid] == lane]
        s, c = sum(times[n] for n in ids), sum(cpu.get(n, 0.0) for n in ids)
        print(f"{lane:10s} {len(ids):6d} {s:8.0f} {c:7.0f} {c / s if s else 0:6.2f}")
    print(f"\nthe {args.top} slowest files")
    for path, s in sorted(per_file.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {s:7.0f} s  {path}")
    print(f"\nthe {args.top} slowest tests")
    for nid, s in sorted(times.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {s:7.0f} s  [{tier_of.get(nid, '?')}] {nid}")


if __name__ == "__main__":
    main()
