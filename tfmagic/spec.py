"""Cluster descriptions: task names, shapes and the spec TensorFlow reads.

Nothing here imports TensorFlow or starts anything, so it is cheap to use and
easy to test.  A task is written ``worker:1`` to people and
``/job:worker/task:1`` to TensorFlow; both are accepted everywhere.

>>> TaskName.parse("/job:worker/task:1")
'worker:1'
>>> TaskName.parse("/job:worker/task:1").index
1
>>> str(TaskName.parse("ps:0")), TaskName.parse("ps:0").device
('ps:0', '/job:ps/replica:0/task:0')
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .errors import BadClusterShape, BadTaskName, UnknownTask

_SHORT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([0-9]+)\s*$", re.ASCII)
_LONG = re.compile(
    r"^\s*/job:([A-Za-z_][A-Za-z0-9_]*)(?:/replica:[0-9]+)?/task:([0-9]+)(?:/device:.*)?\s*$", re.ASCII
)
_JOB_ONLY = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*$")

#: Jobs in the order TensorFlow users expect to read them.
JOB_ORDER = ("chief", "ps", "worker", "evaluator")


class TaskName(str):
    """One task of a cluster: a job name and an index within that job.

    A task name *is* its text (``"worker:1"``), so it goes into events, logs,
    JSON and dictionaries as it is, and a ``"worker:1"`` typed by a user finds
    it; it also knows its parts and its TensorFlow device, so nothing has to
    parse it back.  Sorting follows the cluster's order (``worker:2`` before
    ``worker:10``).

    >>> t = TaskName("worker", 1)
    >>> t == "worker:1", t.job, t.index, {"worker:1": 0}[t]
    (True, 'worker', 1, 0)
    """

    job: str
    index: int

    def __new__(cls, job: str, index: int) -> TaskName:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise BadTaskName(f"a task index is a whole number >= 0, not {index!r}")
        self = super().__new__(cls, f"{job}:{index}")
        object.__setattr__(self, "job", job)
        object.__setattr__(self, "index", index)
        return self

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError("TaskName is immutable")

    def __getnewargs__(self) -> tuple[str, int]:  # pickle, copy
        return (self.job, self.index)

    @classmethod
    def parse(cls, text: str | TaskName) -> TaskName:
        """Read ``worker:1``, ``/job:worker/task:1`` or ``/job:worker/replica:0/task:1``."""
        if isinstance(text, TaskName):
            return text
        if not isinstance(text, str):
            raise BadTaskName(f"a task name must be text like 'worker:1', not {text!r}")
        m = _SHORT.match(text) or _LONG.match(text)
        if not m:
            raise BadTaskName(
                f"{text!r} is not a task name; write it as 'worker:1', 'ps:0' or '/job:worker/task:1'"
            )
        return cls(m.group(1), int(m.group(2)))

    @property
    def device(self) -> str:
        """The TensorFlow device prefix that places ops on this task."""
        return f"/job:{self.job}/replica:0/task:{self.index}"

    @property
    def slug(self) -> str:
        """A file-name friendly form, e.g. ``worker-1``."""
        return f"{self.job}-{self.index}"

    def _key(self) -> tuple:
        return (_job_sort_key(self.job), self.index)

    def __lt__(self, other):
        if isinstance(other, TaskName):
            return self._key() < other._key()
        return str.__lt__(self, other)

    def __gt__(self, other):
        if isinstance(other, TaskName):
            return self._key() > other._key()
        return str.__gt__(self, other)

    def __le__(self, other):
        return self == other or self < other

    def __ge__(self, other):
        return self == other or self > other

    __hash__ = str.__hash__
    __eq__ = str.__eq__

    def __str__(self) -> str:
        return str.__str__(self)

    # repr is the text's, so a dict of tasks prints as {'worker:1': ...} wherever users see one
    __repr__ = str.__repr__


def _job_sort_key(job: str) -> tuple[int, str]:
    return (JOB_ORDER.index(job) if job in JOB_ORDER else len(JOB_ORDER), job)


@dataclass(frozen=True)
class ClusterShape:
    """How many tasks each job has: ``ClusterShape(ps=1, workers=2)``.

    ``ps=0`` is a valid worker-only cluster (for all-reduce training); a
    cluster without workers is not, because nothing could compute on it.
    """

    ps: int = 1
    workers: int = 2
    chief: int = 0

    def __post_init__(self) -> None:
        for name, value, minimum in (
            ("workers", self.workers, 1),
            ("ps", self.ps, 0),
            ("chief", self.chief, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadClusterShape(f"{name} must be a whole number, not {value!r}; for example workers=2")
            if value < minimum:
                raise BadClusterShape(
                    f"{name}={value} is too small: a cluster needs at least "
                    f"{minimum} {name}"
                    + (" (use ps=0 for a worker-only cluster)" if name == "workers" else "")
                )
        if self.chief > 1:
            raise BadClusterShape(f"chief={self.chief}: a cluster has at most one chief")

    def counts(self) -> dict[str, int]:
        """Job name to number of tasks, without empty jobs."""
        out = {"chief": self.chief, "ps": self.ps, "worker": self.workers}
        return {job: n for job, n in out.items() if n}

    def tasks(self) -> list[TaskName]:
        """Every task, ps first: the order they are started and listed in."""
        return [TaskName(job, i) for job, n in self.counts().items() for i in range(n)]

    @property
    def size(self) -> int:
        return self.ps + self.workers + self.chief

    def describe(self) -> str:
        parts = []
        if self.chief:
            parts.append("1 chief")
        parts.append(f"{self.ps} ps")
        parts.append(f"{self.workers} worker" + ("s" if self.workers != 1 else ""))
        return ", ".join(parts)


@dataclass
class ClusterDef:
    """Addresses of every task: the plain-data twin of ``tf.train.ClusterSpec``."""

    jobs: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, list[str] | Mapping[int, str]]) -> ClusterDef:
        """Accept the shapes TensorFlow accepts: lists, or {index: address} dicts."""
        jobs: dict[str, list[str]] = {}
        for job, addrs in mapping.items():
            if isinstance(addrs, Mapping):
                indices = sorted(int(i) for i in addrs)
                if indices != list(range(len(indices))):
                    raise BadClusterShape(f"job {job!r} has task indices {indices}; tfmagic needs 0..n-1")
                jobs[job] = [addrs[i] if i in addrs else addrs[str(i)] for i in indices]
            else:
                jobs[job] = list(addrs)
        return cls({j: jobs[j] for j in sorted(jobs, key=_job_sort_key)})

    @classmethod
    def from_json(cls, text: str) -> ClusterDef:
        """Read a ClusterSpec dict or a whole ``TF_CONFIG`` (its ``cluster`` part)."""
        data = json.loads(text)
        if isinstance(data, dict) and "cluster" in data:
            data = data["cluster"]
        if not isinstance(data, dict):
            raise BadClusterShape("a cluster spec must be a JSON object of job -> addresses")
        return cls.from_mapping(data)

    def tasks(self) -> list[TaskName]:
        return [TaskName(job, i) for job, addrs in self.jobs.items() for i in range(len(addrs))]

    def __iter__(self) -> Iterator[TaskName]:
        return iter(self.tasks())

    def __contains__(self, task: object) -> bool:
        try:
            t = TaskName.parse(task)  # type: ignore[arg-type]
        except BadTaskName:
            return False
        return t.job in self.jobs and 0 <= t.index < len(self.jobs[t.job])

    def check(self, task: str | TaskName) -> TaskName:
        """Parse ``task`` and make sure it is in this cluster, with a helpful error."""
        t = TaskName.parse(task)
        if t in self:
            return t
        have = ", ".join(
            f"{job}:0" if len(a) == 1 else f"{job}:0..{job}:{len(a) - 1}" for job, a in self.jobs.items()
        )
        raise UnknownTask(
            f"{t} is not in this cluster, which has {have}; pick one of those "
            "or start a bigger cluster (%tf_cluster start ... --replace)"
        )

    def address(self, task: str | TaskName) -> str:
        t = self.check(task)
        return self.jobs[t.job][t.index]

    def shape(self) -> ClusterShape:
        return ClusterShape(
            ps=len(self.jobs.get("ps", [])),
            workers=len(self.jobs.get("worker", [])),
            chief=len(self.jobs.get("chief", [])),
        )

    def as_dict(self) -> dict[str, list[str]]:
        return {job: list(addrs) for job, addrs in self.jobs.items()}

    def tf_config(self, task: str | TaskName) -> dict:
        """The ``TF_CONFIG`` a program running as ``task`` would read."""
        t = self.check(task)
        return {"cluster": self.as_dict(), "task": {"type": t.job, "index": t.index}}

    def to_tf(self):
        """A ``tf.train.ClusterSpec`` (imports TensorFlow)."""
        import tensorflow as tf

        return tf.train.ClusterSpec(self.as_dict())
