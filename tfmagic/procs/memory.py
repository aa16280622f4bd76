"""How much memory this process may use: the lowest limit that applies to it.

A notebook often runs inside a container or a batch job whose cgroup allows
far less than the machine has (Binder: about 2 GB on a 64 GB host).  Reading
only the machine's RAM, or only the cgroup files at the root of
``/sys/fs/cgroup``, said "4.00 GB" inside a 1.2 GB cgroup, and a worker was
OOM-killed right after its start was reported a success.  So every limit on
this process's way up its cgroup tree counts:

* the machine's physical memory;
* cgroup v2: ``memory.max`` of the process's cgroup (``0::/path`` in
  ``/proc/self/cgroup``) and of every ancestor up to the root of the cgroup2
  mount (``max`` means none);
* cgroup v1: ``memory.limit_in_bytes`` of the ``memory`` controller's cgroup
  and its ancestors (a huge value means none).

What is *available* under each limit is that limit minus what its cgroup
uses now (``memory.current`` / ``memory.usage_in_bytes``, without the page
cache the kernel can drop: ``inactive_file``), and psutil's ``available`` for
the machine; the smallest of those counts.

Example::

    from tfmagic.procs.memory import check_fits, memory_available, memory_limit
    memory_limit()                      # bytes: the lowest limit on this process
    check_fits(3, 420 * 2**20)          # raises WillNotFit when 3 tasks would not fit
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import WillNotFit
from ..units import human_bytes

#: cgroup v1 writes "no limit" as a huge number (about 2**63, rounded to pages).
_V1_UNLIMITED = 2**60


@dataclass(frozen=True)
class Limit:
    """One memory limit on a process: how many bytes, where it is set, and what is used under it."""

    bytes: int
    #: ``"physical memory"`` or the file that sets it (``.../memory.max``)
    source: str
    #: bytes used now under this limit, page cache the kernel can drop not counted
    #: (``None`` for the machine: psutil's ``available`` is used for it)
    used: int | None = None

    @property
    def cgroup(self) -> bool:
        return self.used is not None

    @property
    def available(self) -> int:
        if self.used is None:
            import psutil

            return int(psutil.virtual_memory().available)
        return max(0, self.bytes - self.used)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _unescape(field: str) -> str:
    r"""mountinfo writes space, tab, newline and backslash as octal escapes (``\040``)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _mounts(mountinfo: Path) -> list[tuple[str, str, str, set[str]]]:
    """(root inside the filesystem, mount point, type, super options) of each mount."""
    found = []
    for line in (_read(mountinfo) or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        found.append((_unescape(fields[3]), _unescape(fields[4]), tail[0], set(tail[2].split(","))))
    return found


def _chain(path: str, mounts: list[tuple[str, str]]) -> list[Path]:
    """The cgroup directory of ``path`` and its ancestors up to the mount's root, nearest first."""
    for root, point in mounts:
        if root == "/":
            rel = path
        elif path == root or path.startswith(root.rstrip("/") + "/"):
            rel = path[len(root.rstrip("/")) :]
        else:
            continue
        top = Path(point)
        here = top / rel.lstrip("/")
        if not here.is_dir():
            continue
        chain = [here]
        while here != top and here.parent != here:
            here = here.parent
            chain.append(here)
        return chain
    # the path is not under any mount we can see (a container without its own
    # cgroup namespace): the mount's root is what the old root-only check read
    return [Path(point) for _, point in mounts[:1]]


def _int_of(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _stat_value(directory: Path, *keys: str) -> int:
    """The first of ``keys`` found in ``directory/memory.stat`` (0 when none is)."""
    values = {}
    for line in (_read(directory / "memory.stat") or "").splitlines():
        name, _, value = line.partition(" ")
        values[name] = value
    for key in keys:
        if (value := _int_of(values.get(key))) is not None:
            return value
    return 0


def cgroup_limits(proc: str | os.PathLike = "/proc/self") -> list[Limit]:
    """Every cgroup memory limit on the process ``proc`` describes, nearest cgroup first.

    ``proc`` is a ``/proc/PID`` directory (its ``cgroup`` and ``mountinfo``
    files are read); tests point it at files of their own.
    """
    proc = Path(proc)
    mounts = _mounts(proc / "mountinfo")
    v2 = [(root, point) for root, point, kind, _ in mounts if kind == "cgroup2"]
    v1 = [(root, point) for root, point, kind, opts in mounts if kind == "cgroup" and "memory" in opts]
    found: list[Limit] = []
    for line in (_read(proc / "cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "" and v2:
            for directory in _chain(path, v2):
                limit = _read(directory / "memory.max")
                if limit is None or limit == "max" or _int_of(limit) is None:
                    continue
                used = _int_of(_read(directory / "memory.current")) or 0
                used -= _stat_value(directory, "inactive_file")
                found.append(Limit(int(limit), str(directory / "memory.max"), max(0, used)))
        elif "memory" in controllers.split(",") and v1:
            for directory in _chain(path, v1):
                limit = _int_of(_read(directory / "memory.limit_in_bytes"))
                if limit is None or limit >= _V1_UNLIMITED:
                    continue
                used = _int_of(_read(directory / "memory.usage_in_bytes")) or 0
                used -= _stat_value(directory, "total_inactive_file", "inactive_file")
                found.append(Limit(limit, str(directory / "memory.limit_in_bytes"), max(0, used)))
    return found


def limits(proc: str | os.PathLike = "/proc/self") -> list[Limit]:
    """The machine's memory, then every cgroup limit on the process (see :func:`cgroup_limits`)."""
    import psutil

    return [Limit(int(psutil.virtual_memory().total), "physical memory"), *cgroup_limits(proc)]


def lowest_limit(proc: str | os.PathLike = "/proc/self") -> Limit:
    """The limit that binds first (the smallest)."""
    return min(limits(proc), key=lambda limit: limit.bytes)


def memory_limit(proc: str | os.PathLike = "/proc/self") -> int:
    """The most memory this process (and what it starts) may use, in bytes."""
    return lowest_limit(proc).bytes


def memory_available(proc: str | os.PathLike = "/proc/self") -> int:
    """How much more this process (and what it starts) may use now, in bytes."""
    return min(limit.available for limit in limits(proc))


def tightest_limit() -> tuple[Limit, str]:
    """The limit that leaves this process the least now, and where it comes from, in words."""
    binding = min(limits(), key=lambda limit: limit.available)
    return binding, "this machine's memory" if not binding.cgroup else f"its cgroup's limit, {binding.source}"


def check_fits(n_tasks: int, per_task_bytes: int, extra_bytes: int = 0) -> int:
    """Raise :class:`~tfmagic.errors.WillNotFit` unless ``n_tasks`` more processes fit now.

    ``per_task_bytes`` is what one task costs, ``extra_bytes`` anything else
    the start needs besides (spares to be kept warm, say).  Returns the bytes
    available, so a caller can tell how close it came.
    """
    need = n_tasks * per_task_bytes + extra_bytes
    binding, where = tightest_limit()
    available = binding.available
    if need <= available:
        return available
    besides = f" + {human_bytes(extra_bytes)} besides" if extra_bytes else ""
    raise WillNotFit(
        f"the cluster needs about {human_bytes(need)} ({n_tasks} task processes at "
        f"{human_bytes(per_task_bytes)} each{besides}) but this process's memory limit "
        f"({human_bytes(binding.bytes)}, {where}) leaves {human_bytes(available)}; "
        "start fewer workers or ps tasks, or free the memory of warm spares with %tf_cluster spares off"
    )
