"""Memory limits: the lowest one on this process, from real cgroups and from laid-out files.

The real test makes a cgroup (v2 where its memory controller is available,
else v1), gives it ``1.2G`` or ``6G``, moves a fresh Python process into it
before that process reads anything, and checks what tfmagic reports there.
The parsing tests lay ``/proc/self/cgroup``, ``mountinfo`` and cgroup files
out in a temporary directory, for the layouts this machine does not have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tfmagic import pool
from tfmagic.errors import ClusterStartError, WillNotFit
from tfmagic.procs import memory

GiB = 2**30
REPO = str(Path(__file__).resolve().parents[1])

# --- laid-out files ------------------------------------------------------------------------------


def _layout(tmp_path: Path, cgroup: str, mounts: list[tuple[str, str, str, str]]) -> Path:
    """A fake ``/proc/PID`` with ``cgroup`` and ``mountinfo`` ((root, point, type, super options))."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    lines = [
        f"{30 + i} 23 0:{40 + i} {root} {point.replace(' ', chr(92) + '040')} rw,relatime - {kind} {kind} {opts}"
        for i, (root, point, kind, opts) in enumerate(mounts)
    ]
    (proc / "mountinfo").write_text(
        "23 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n" + "\n".join(lines) + "\n"
    )
    return proc


def _files(directory: Path, **files: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text + "\n")


@pytest.mark.unit
def test_v2_the_limit_of_an_ancestor_applies_and_max_means_none(tmp_path):
    mnt = tmp_path / "cg2"
    _files(mnt, cgroup_controllers="memory")  # the root of a real hierarchy has no memory.max
    _files(
        mnt / "job",
        memory_max=str(int(1.2 * GiB)),
        memory_current=str(500 * 2**20),
        memory_stat="anon 300000000\ninactive_file 104857600\nactive_file 1",
    )
    _files(mnt / "job" / "kernel", memory_max="max", memory_current=str(200 * 2**20), memory_stat="")
    proc = _layout(tmp_path, "0::/job/kernel\n", [("/", str(mnt), "cgroup2", "rw,nsdelegate")])
    limits = memory.cgroup_limits(proc)
    assert [(lim.bytes, lim.source) for lim in limits] == [(int(1.2 * GiB), str(mnt / "job" / "memory.max"))]
    assert memory.memory_limit(proc) == int(1.2 * GiB)
    # used = current - inactive_file (page cache the kernel drops before it kills)
    assert memory.memory_available(proc) == int(1.2 * GiB) - (500 - 100) * 2**20


@pytest.mark.unit
def test_v2_the_nearest_limit_wins_when_it_is_lower(tmp_path):
    mnt = tmp_path / "cg2"
    _files(mnt / "a", memory_max=str(4 * GiB), memory_current="0")
    _files(mnt / "a" / "b", memory_max=str(GiB), memory_current=str(GiB + 5))
    proc = _layout(tmp_path, "0::/a/b\n", [("/", str(mnt), "cgroup2", "rw")])
    assert [lim.bytes for lim in memory.cgroup_limits(proc)] == [GiB, 4 * GiB]
    assert memory.memory_limit(proc) == GiB
    assert memory.memory_available(proc) == 0, "over its limit: nothing left, never negative"


@pytest.mark.unit
def test_v1_huge_values_mean_none_and_a_namespaced_mount_root_maps_the_path(tmp_path):
    """A container without its own cgroup namespace: /proc/self/cgroup names the host's path,
    the mount shows only the container's subtree (its root field)."""
    mnt = tmp_path / "memory with space"
    _files(mnt, memory_limit_in_bytes="9223372036854771712", memory_usage_in_bytes="1")
    _files(
        mnt / "inner",
        memory_limit_in_bytes=str(2 * GiB),
        memory_usage_in_bytes=str(GiB),
        memory_stat="cache 5\ninactive_file 7\ntotal_inactive_file 268435456",
    )
    cgroup = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc/inner\n1:name=systemd:/docker/abc\n0::/\n"
    proc = _layout(tmp_path, cgroup, [("/docker/abc", str(mnt), "cgroup", "rw,memory")])
    limits = memory.cgroup_limits(proc)
    assert [(lim.bytes, lim.source) for lim in limits] == [
        (2 * GiB, str(mnt / "inner" / "memory.limit_in_bytes"))
    ]
    assert memory.memory_available(proc) == 2 * GiB - (GiB - 2**28)  # the hierarchical total_inactive_file


@pytest.mark.unit
def test_v1_and_v2_together_the_lowest_of_all_counts(tmp_path):
    v1, v2 = tmp_path / "memory", tmp_path / "unified"
    _files(v1 / "slice", memory_limit_in_bytes=str(3 * GiB), memory_usage_in_bytes="0")
    _files(v2 / "slice", memory_max=str(GiB), memory_current="0")
    proc = _layout(
        tmp_path,
        "4:memory:/slice\n0::/slice\n",
        [("/", str(v1), "cgroup", "rw,memory"), ("/", str(v2), "cgroup2", "rw")],
    )
    assert sorted(lim.bytes for lim in memory.cgroup_limits(proc)) == [GiB, 3 * GiB]
    assert memory.memory_limit(proc) == GiB
    assert memory.lowest_limit(proc).source == str(v2 / "slice" / "memory.max")


@pytest.mark.unit
def test_no_cgroup_limit_means_the_machines_memory(tmp_path):
    mnt = tmp_path / "cg2"
    _files(mnt / "free", memory_max="max", memory_current="123")
    proc = _layout(tmp_path, "0::/free\n", [("/", str(mnt), "cgroup2", "rw")])
    assert memory.cgroup_limits(proc) == []
    assert memory.memory_limit(proc) == psutil.virtual_memory().total
    (tmp_path / "bare").mkdir()
    empty = _layout(tmp_path / "bare", "", [])  # no cgroups at all (another system)
    assert memory.cgroup_limits(empty) == [] and memory.memory_limit(empty) == psutil.virtual_memory().total


@pytest.mark.unit
def test_this_process_and_pool_agree_and_check_fits_says_what_to_do():
    assert pool.memory_limit() == memory.memory_limit() <= psutil.virtual_memory().total
    assert 0 < memory.memory_available() <= memory.memory_limit()
    assert memory.check_fits(1, 2**20) > 2**20
    with pytest.raises(WillNotFit) as caught:
        memory.check_fits(3, 2**50, extra_bytes=GiB)
    message = str(caught.value)
    assert isinstance(caught.value, ClusterStartError)
    assert "\n" not in message
    assert message.startswith("the cluster needs about ")
    assert "3 task processes" in message and "+ 1.00 GB besides" in message
    assert "fewer workers" in message and "%tf_cluster spares off" in message


# --- a real cgroup ---------------------------------------------------------------------------------

PROBE = """
import json, os, sys
with open(sys.argv[1], "w") as f:  # into the test's cgroup before anything is read
    f.write(str(os.getpid()))
from tfmagic.procs import memory
from tfmagic import pool
from tfmagic.errors import WillNotFit
out = {
    "limit": memory.memory_limit(),
    "available": memory.memory_available(),
    "pool_limit": pool.memory_limit(),
    "budget": pool.auto_budget(),
    "sources": [lim.source for lim in memory.limits()],
}
try:
    memory.check_fits(4, 420 * 2**20)
except WillNotFit as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""


def _own_cgroup(version: str) -> Path | None:
    """This process's cgroup directory in the v2 or the v1 memory hierarchy (read here independently)."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if version == "v2" and tail[0] == "cgroup2":
            mounts.append((fields[3], fields[4]))
        if version == "v1" and tail[0] == "cgroup" and "memory" in tail[2].split(","):
            mounts.append((fields[3], fields[4]))
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        wanted = (
            (hierarchy == "0" and not controllers) if version == "v2" else "memory" in controllers.split(",")
        )
        if wanted:
            for root, point in mounts:
                if root == "/" or path.startswith(root):
                    rel = path if root == "/" else path[len(root) :]
                    found = Path(point) / rel.lstrip("/")
                    if found.is_dir():
                        return found
    return None


def _make_cgroup(version: str, limit: str) -> tuple[Path, Path]:
    """(the limited cgroup, an unlimited child of it to run in); skips when this machine cannot."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a cgroup")
    own = _own_cgroup(version)
    if own is None:
        pytest.skip(f"no cgroup {version} memory hierarchy here")
    name = f"tfmagic-test-{os.getpid()}"
    if version == "v2":
        root = own
        while (root.parent / "cgroup.controllers").exists():
            root = root.parent
        controllers = (root / "cgroup.controllers").read_text().split()
        if "memory" not in controllers:
            pytest.skip(
                f"cgroup v2 has no memory controller here (its controllers: {' '.join(controllers) or 'none'}; "
                "memory is bound to the v1 hierarchy), so the v2 layout is tested on laid-out files"
            )
        parent, knob, inner_knob = root, "memory.max", "max"
        if "memory" not in (root / "cgroup.subtree_control").read_text().split():
            try:
                (root / "cgroup.subtree_control").write_text("+memory")
            except OSError as exc:
                pytest.skip(f"cannot enable the memory controller for child cgroups here: {exc}")
    else:
        parent, knob, inner_knob = own, "memory.limit_in_bytes", None
    limited = parent / name
    try:
        limited.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup under {parent}: {exc}")
    try:
        (limited / knob).write_text(limit)
        if version == "v2":
            (limited / "cgroup.subtree_control").write_text("+memory")
        inner = limited / "inner"
        inner.mkdir()
        if inner_knob:
            (inner / knob).write_text(inner_knob)
    except OSError:
        _remove(limited)
        raise
    return limited, inner


def _remove(limited: Path) -> None:
    for directory in (limited / "inner", limited):
        for _ in range(50):
            try:
                if directory.exists():
                    directory.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert not limited.exists(), f"the test cgroup {limited} could not be removed"


@pytest.mark.unit
@pytest.mark.parametrize("version", ["v2", "v1"])
@pytest.mark.parametrize(
    ("limit", "expected", "budget"),
    [(str(int(1.2 * GiB)), "1.20 GB", 0), ("6G", "6.00 GB", int(1.5 * GiB))],
    ids=["1.2G", "6G"],
)
def test_a_process_in_a_limited_cgroup_reports_that_limit_and_the_budget_follows(
    version, limit, expected, budget
):
    from tfmagic.units import human_bytes

    limited, inner = _make_cgroup(version, limit)
    probe = None
    try:
        probe = subprocess.Popen(
            [sys.executable, "-c", PROBE, str(inner / "cgroup.procs")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        out, err = probe.communicate(timeout=60)
        assert probe.returncode == 0, err
        got = json.loads(out)
    finally:
        if probe is not None and probe.poll() is None:
            probe.kill()
            probe.wait(timeout=10)
        _remove(limited)
    assert human_bytes(got["limit"]) == expected, got
    assert got["pool_limit"] == got["limit"]
    assert any(str(limited) in source for source in got["sources"]), "the ancestor's limit was found"
    assert got["limit"] * 0.8 < got["available"] <= got["limit"], got
    assert got["budget"] == budget, "no spares under 4 GiB; a quarter of the limit above"
    if budget == 0:
        assert "error" in got and f"memory limit ({expected}" in got["error"] and "spares off" in got["error"]
    else:
        assert "error" not in got, got
