"""A kernel's clusters, published for the Jupyter server's pages (``<base_url>tfmagic/``).

The server extension (:mod:`tfmagic.server`) cannot reach into a kernel: it
is another process.  So each kernel the server starts (the server puts
:data:`ENV_DIR` in the environment its kernels inherit) writes what the
pages show into that private directory:

* ``<id>.json``: the cluster's record (kernel, notebook, shape, state,
  memory, the run on it), rewritten when something happens to it and every
  few seconds while a page looks;
* ``<id>.png`` and ``<id>.frame.json``: the dashboard's latest frame (the
  same :class:`~tfmagic.dashboard.Dashboard` picture and table as the
  widget), drawn at :data:`FRAME_EVERY` *only while a page watches*: the
  server touches ``<id>.watching`` on each request of a page, and the
  publisher draws while that file is younger than :data:`WATCH_FRESH`.

Nobody pays when nobody watches: without the variable (a script, a kernel
not started by such a server) :func:`announce` returns at once; with it
and no page open, one thread looks at two files' mtimes twice a second
(measured with a started cluster and nothing watching: 0.5 ms of the
kernel's CPU a second; 0.0 without the variable).

Security: the directory must be ours, a real directory (not a link) that
nobody else can read or write (mode 0700; checked without following links,
as the bind library's cache is); anything else and nothing is published.  Every file is
written as a new file and renamed into place, so a reader never sees half.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import threading
import time
import weakref
from pathlib import Path

from . import events
from .gilshare import yielding
from .network.bindguard import trusted_dir

log = logging.getLogger("tfmagic.publish")

#: set by the server extension for the kernels it starts: where their clusters are published
ENV_DIR = "TFMAGIC_PUBLISH_DIR"
#: seconds between frames while a page watches (the pages promise at least two a second)
FRAME_EVERY = 0.2
#: seconds between cluster tables in the frames (the table reads each task's CPU: 30-110 ms here)
TABLE_EVERY = 0.5
#: seconds between looks at the watching files while nobody watches (a page's first frame waits this long)
IDLE_LOOK = 0.5
#: a page counts as watching for this long after its last request
WATCH_FRESH = 3.0
#: seconds between record rewrites while a page looks (memory, the run's progress)
RECORD_EVERY = 2.0
#: the file the list page touches
LIST_WATCH = "list.watching"

#: the folder (in the publish directory) of the experiments' results, for a class's table
RESULTS = "experiments"
#: how many results a kernel's server keeps (the newest)
KEEP_RESULTS = 20

_ID = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")


def valid_id(text: str) -> bool:
    """Whether ``text`` can name a record (the server checks ids from URLs with it)."""
    return bool(_ID.match(text)) and not text.startswith(".")


def directory() -> Path | None:
    """The publish directory from the environment, if it is set and private; else None."""
    value = os.environ.get(ENV_DIR)
    if not value:
        return None
    path = Path(value)
    try:
        private = not os.lstat(path).st_mode & 0o077  # what training shows is nobody else's to read
    except OSError:
        private = False
    if not (private and trusted_dir(path)):
        log.warning("not publishing clusters to %s: it is not a private directory of this user", path)
        return None
    return path


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file beside ``path`` and rename it into place (mode 0600)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def watched(path: Path, now: float | None = None) -> bool:
    """Whether a page touched ``path`` within :data:`WATCH_FRESH` seconds."""
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return False
    return (now or time.time()) - mtime < WATCH_FRESH


def process_start(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _hang(cluster) -> str:
    """The hang doctor's line while something on ``cluster`` has waited over its threshold, else ''.

    Free while nothing waits (one look at the wait registry), as the dashboard's banner is.
    """
    try:
        from . import doctor

        return doctor.why(cluster).banner if doctor.waiting(cluster) else ""
    except Exception:  # a record without the line, never a failed record
        log.debug("no hang line for %s", cluster.name, exc_info=True)
        return ""


def _kernel_id() -> str:
    """The Jupyter kernel id, read from the connection file on the kernel's command line."""
    for arg in sys.argv:
        m = re.search(r"kernel-([0-9a-f-]{8,})\.json$", arg)
        if m:
            return m.group(1)
    return ""


class _Published:
    """One cluster's record, and its dashboard while a page watches."""

    def __init__(self, root: Path, cluster) -> None:
        self.root = root
        self.ref = weakref.ref(cluster)
        self.id = f"{os.getpid()}-{cluster.name}"
        self.started_at = time.time()
        self.dashboard = None
        self.run = None
        self.frame = 0
        self.next_frame = 0.0
        self.next_table = 0.0
        self.table_html = ""
        self.next_record = 0.0
        self.final = False
        self.dirty = threading.Event()
        self.sub = cluster.events.subscribe(lambda event: self.dirty.set())

    def path(self, suffix: str) -> Path:
        return self.root / f"{self.id}{suffix}"

    def record(self) -> dict:
        cluster = self.ref()
        rec = {
            "id": self.id,
            "kernel_pid": os.getpid(),
            "kernel_started": process_start(os.getpid()),
            "kernel_id": _kernel_id(),
            "notebook": os.environ.get("JPY_SESSION_NAME", ""),
            "started_at": self.started_at,
            "updated_at": time.time(),
        }
        if cluster is None:
            return rec | {"cluster": "?", "shape": "", "state": "stopped", "memory": None, "run": ""}
        memory = 0
        tasks = []
        for task, proc in list(cluster.procs.items()):
            alive = proc.alive
            rss = None
            if alive and proc.task_pid:
                try:
                    import psutil

                    rss = psutil.Process(proc.task_pid).memory_info().rss
                except Exception:  # noqa: BLE001 - a task gone (or remote) between two reads: no figure
                    rss = None
            memory += rss or 0
            tasks.append({"task": str(task), "alive": alive, "pid": proc.task_pid, "rss": rss})
        run = self._latest_run(cluster)
        run_text = ""
        progress: dict = {}
        if run is not None:
            history = getattr(run, "history", None)
            if history is not None:
                run_text = f"{history.run}: {history.steps} updates" + (", done" if history.done else "")
                progress = {
                    "run_mode": history.mode,
                    "run_steps": history.steps,
                    "run_done": history.done,
                    "run_rate": round(history.updates_per_s(), 2),
                    "run_loss": _plain(history.latest_loss),
                }
        return (
            rec
            | {
                "cluster": cluster.name,
                "hang": _hang(cluster),
                "shape": cluster.describe(),
                "state": "running" if cluster.running else "stopped",
                "memory": memory or None,
                "tasks": tasks,
                "run": run_text,
            }
            | progress
        )

    def write_record(self) -> dict:
        rec = self.record()
        write_atomic(self.path(".json"), json.dumps(rec).encode())
        return rec

    def _latest_run(self, cluster):
        run = next(iter(events.started), None)
        return run if run is not None and getattr(run, "cluster", None) is cluster else None

    def draw(self, cluster) -> None:
        """One frame of the dashboard into ``<id>.png`` and ``<id>.frame.json``.

        Drawn with a short GIL switch interval, as the notebook's dashboard is
        (see :mod:`tfmagic.gilshare`): a page watching must not slow the training it shows.
        """
        with yielding():
            self._draw(cluster)

    def _draw(self, cluster) -> None:
        run = self._latest_run(cluster)
        if self.dashboard is None or run is not self.run:
            self.stop_dashboard()
            from .dashboard import Dashboard

            before = Dashboard._latest  # the notebook's own latest dashboard stays Dashboard.latest()
            self.dashboard = Dashboard(cluster, runs=[run] if run is not None else [])
            Dashboard._latest = before
            self.run = run
        png = self.dashboard.draw()
        self.frame += 1
        write_atomic(self.path(".png"), png)
        now = time.time()
        if now >= self.next_table or not cluster.running:
            self.table_html = self.dashboard.table_html()
            self.next_table = now + TABLE_EVERY
        frame = {
            "frame": self.frame,
            "time": now,
            "header_html": self.dashboard.header_html(),
            "table_html": self.table_html,
            "state": "running" if cluster.running else "stopped",
        }
        write_atomic(self.path(".frame.json"), json.dumps(frame).encode())

    def stop_dashboard(self) -> None:
        dashboard, self.dashboard, self.run = self.dashboard, None, None
        if dashboard is not None:  # let go first: a stop that raises must not keep it drawing
            dashboard.stop()

    def due(self) -> float:
        """When this cluster next needs the thread (a frame while watched; else a look at the file)."""
        return self.next_frame if self.dashboard is not None else time.time() + IDLE_LOOK

    def tick(self, now: float, list_watched: bool) -> bool:
        """Do what is due; returns False once the cluster has stopped and its last record is written."""
        cluster = self.ref()
        watching = watched(self.path(".watching"), now)
        if cluster is None or not cluster.running:
            if watching and cluster is not None:
                self.draw(cluster)  # the last frame, with the stopped table
            self.stop_dashboard()
            self.sub.close()
            self.write_record()
            return False
        if not watching:
            self.stop_dashboard()  # nobody looks: no subscriptions, no drawing (first: a record may fail)
        if self.dirty.is_set() or ((watching or list_watched) and now >= self.next_record):
            self.dirty.clear()
            self.write_record()
            self.next_record = now + RECORD_EVERY
        if watching and now >= self.next_frame:
            # on a fixed cadence (not FRAME_EVERY after a slow frame), skipping frames it is late for
            self.next_frame = max(self.next_frame + FRAME_EVERY, now)
            self.draw(cluster)
        return True


class Publisher:
    """The kernel's one publishing thread; it follows every announced cluster until it stops."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._items: dict[int, _Published] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def add(self, cluster) -> None:
        with self._lock:
            if id(cluster) in self._items and self._items[id(cluster)].ref() is cluster:
                return
            item = _Published(self.root, cluster)
            self._items[id(cluster)] = item
            item.write_record()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="tfmagic-publish", daemon=True)
                self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        while True:
            now = time.time()
            list_watched = watched(self.root / LIST_WATCH, now)
            with self._lock:
                items = list(self._items.items())
            for key, item in items:
                try:
                    alive = item.tick(now, list_watched)
                except Exception:  # a failed frame or record must not end publishing (logged)
                    log.debug("publishing %s failed", item.id, exc_info=True)
                    alive = True
                if not alive:
                    with self._lock:
                        self._items.pop(key, None)
            with self._lock:
                if not self._items:
                    self._thread = None
                    return
                due = min(item.due() for item in self._items.values())
            self._wake.wait(min(max(0.0, due - time.time()), IDLE_LOOK))
            self._wake.clear()


_publisher: Publisher | None = None
_publisher_lock = threading.Lock()


def announce(cluster) -> bool:
    """Publish ``cluster`` for the server's pages, if this kernel was started by one; returns whether.

    Called by the session when a cluster starts or is attached.  Never
    raises: a page that cannot be fed must not stop a start.
    """
    global _publisher
    if not os.environ.get(ENV_DIR):
        return False
    try:
        root = directory()
        if root is None:
            return False
        with _publisher_lock:
            if _publisher is None or _publisher.root != root:
                _publisher = Publisher(root)
            publisher = _publisher
        publisher.add(cluster)
        return True
    except Exception:  # publishing is a courtesy to the pages, never a reason to fail (logged)
        log.warning("could not publish cluster %s for the Jupyter pages", cluster.name, exc_info=True)
        return False


def _plain(value):
    """A measured figure as JSON holds it (numpy numbers become floats; anything else its text)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None  # JSON has no NaN: a page's parser refuses it


def publish_result(result) -> bool:
    """Publish an experiment's result for the server's pages (a class's table); returns whether.

    Written to ``<dir>/experiments/`` as the records are (new file, renamed into place); the
    newest :data:`KEEP_RESULTS` stay.  Never raises: a table that cannot be fed must not fail
    the experiment that was run.
    """
    root = directory() if os.environ.get(ENV_DIR) else None
    if root is None:
        return False
    try:
        folder = root / RESULTS
        folder.mkdir(mode=0o700, exist_ok=True)
        if not trusted_dir(folder):
            return False
        record = {
            "experiment": result.name,
            "seed": result.seed,
            "holds": bool(result.holds),
            "why": result.why,
            "seconds": round(float(result.seconds), 1),
            "measured": {str(k): _plain(v) for k, v in result.measured.items()},
            "checks": [
                {
                    "label": c.label,
                    "value": _plain(c.value),
                    "bound": _plain(c.bound),
                    "op": c.op,
                    "passed": bool(c.passed),
                    "meaning": c.meaning,
                }
                for c in result.checks
            ],
            "finished_at": time.time(),
            "kernel_pid": os.getpid(),
            "notebook": os.environ.get("JPY_SESSION_NAME", ""),
        }
        write_atomic(folder / f"{time.time_ns()}-{os.getpid()}.json", json.dumps(record).encode())
        for old in sorted(folder.glob("*.json"))[:-KEEP_RESULTS]:
            old.unlink(missing_ok=True)
        return True
    except Exception:  # publishing is a courtesy to the pages, never a reason to fail (logged)
        log.warning("could not publish the result of %s for the Jupyter pages", result.name, exc_info=True)
        return False
