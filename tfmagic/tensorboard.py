"""TensorBoard for tfmagic's runs: event files per mode and per task, and TensorBoard in the notebook.

Writing: ``tfmagic.train(cluster, ..., logdir="tb")`` (``%tf_train --logdir tb``)
makes a :class:`Writer` that follows the run's :class:`~tfmagic.metrics.History`
and writes, under ``<logdir>/<run>/`` (the run is named after its mode,
``sync`` or ``async``, unless given a name):

* ``worker-0``, ``worker-1``, ...: each worker's loss, step time and
  staleness (async) or dropped gradients (sync), at that worker's own steps;
* ``global``: the loss of every update, the held-out loss the run measures
  every ``steps/40`` updates (the one measure every mode shares), and a
  histogram of every weight (``weights/hidden/kernel``, ... : one group per
  layer) at those same updates and at the end.

So TensorBoard shows sync and async side by side, per worker.  The histograms
cost nothing extra: the run already reads the weights from the ps for its
held-out loss, and the writer takes that copy.  Everything is written from
one background thread fed by the history, so training never waits on disk.
:func:`write` does the same for a finished run (or a bare History, without
histograms).

Showing: :func:`show` starts (or reuses) a TensorBoard for a logdir and
returns what displays it in the notebook.  On a Jupyter server with
jupyter-server-proxy (Binder, JupyterHub, tfmagic's own server extension sets
``TENSORBOARD_PROXY_URL`` for its kernels) the page reaches it through the
server, at ``<base_url>proxy/<port>/``, so the page needs the server's login.
TensorBoard's own ``%tensorboard --logdir`` reads the same variable, so it
works there too.  TensorBoard listens on 127.0.0.1 only, and ends with the
kernel (it dies with its parent, and the kernel's exit handlers end it too).

What stays open: TensorBoard itself has no login, so any process of any
user on this machine can read its data at ``127.0.0.1:<port>`` (the
docs/security.md says so).  Its port is not chosen in advance: it
is given ``--port=0`` and the operating system picks one as it binds, and
tfmagic reads the port from the listening socket TensorBoard's own process
holds.  A port picked first and bound seconds of import later could be
taken in between by another local user (watching ``/proc/*/cmdline``), who
would then answer in TensorBoard's place, and that same race with
tfmagic's own tasks failed the CI once ("could not bind ... already in
use").  :func:`show` still checks that the socket answering belongs to the
TensorBoard it started before it calls it up, and says so in one line
otherwise.

TensorFlow and TensorBoard are imported lazily, when a writer first writes or
a TensorBoard starts.
"""

from __future__ import annotations

import html
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from .metrics import Evaluation, GlobalStep, History, StepRecord
from .network.sockets import holder, listening_inodes, listening_ports
from .procs import owner

__all__ = ["TensorBoard", "Writer", "show", "write"]

#: how TensorBoard is started: it dies with its parent (the kernel), whatever kills the kernel
_PROGRAM = (
    "import ctypes, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "import tfmagic  # Keras kept out of TensorFlow's import (tfmagic.kerasgate): 1.6 CPU-s, 70 MB\n"
    "from tensorboard.main import run_main\n"
    "sys.argv[0] = 'tensorboard'\n"
    "run_main()\n"
)


def _task_dir(task: str) -> str:
    return str(task).replace(":", "-")


class Writer:
    """Follow ``history`` and write its TensorBoard events under ``root`` (``<logdir>/<run>``).

    ``run`` (a TrainingRun, optional) gives the weights for the histograms:
    the copy its held-out probe read (``run.probed``) and its final weights.
    ``close()`` writes what is queued, the final histograms, and flushes.
    """

    def __init__(self, root: str | os.PathLike, history: History, run=None) -> None:
        self.root = Path(root)
        self.history = history
        self.run = run
        self.names: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._writers: dict[str, object] = {}
        self._last_hist_step: int | None = None
        self._subscription = history.feed.subscribe(self._on_item)
        self._thread = threading.Thread(target=self._loop, name="tfmagic-tensorboard", daemon=True)
        self._thread.start()

    # -- on the training threads: only queue --------------------------------
    def _on_item(self, item) -> None:
        if isinstance(item, StepRecord | GlobalStep):
            self._queue.put(item)
        elif isinstance(item, Evaluation):
            self._queue.put(item)
            probed = getattr(self.run, "probed", None)
            if probed is not None and probed[0] == item.step:
                self._queue.put(("weights", item.step, probed[1]))

    # -- on the writer's thread ----------------------------------------------
    def _writer(self, name: str):
        import tensorflow as tf

        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(
                str(self.root / _task_dir(name)), flush_millis=2000
            )
        return self._writers[name]

    def _weight_names(self, n: int) -> list[str]:
        if not self.names and self.run is not None:
            try:
                self.names = list(self.run.model.weight_names())
            except Exception:  # noqa: BLE001 - a model without names: numbered ones below
                self.names = []
        names = self.names if len(self.names) == n else [f"w{i}" for i in range(n)]
        return [name.replace(":", "_") for name in names]

    def _histograms(self, step: int, weights) -> None:
        import tensorflow as tf

        if self._last_hist_step == step:
            return
        self._last_hist_step = step
        with self._writer("global").as_default(step=step):
            for name, value in zip(self._weight_names(len(weights)), weights):
                tf.summary.histogram(f"weights/{name}", value)

    def _write(self, item) -> None:
        import tensorflow as tf

        if isinstance(item, StepRecord):
            with self._writer(item.task).as_default(step=item.local_step):
                tf.summary.scalar("loss", item.loss)
                tf.summary.scalar("step_time_s", item.duration)
                if item.mode == "async":
                    tf.summary.scalar("staleness", item.staleness)
                else:
                    tf.summary.scalar("dropped", float(item.dropped))
        elif isinstance(item, GlobalStep):
            with self._writer("global").as_default(step=item.step):
                tf.summary.scalar("loss", item.loss)
        elif isinstance(item, Evaluation):
            with self._writer("global").as_default(step=item.step):
                tf.summary.scalar("heldout_loss", item.loss)
        elif isinstance(item, tuple) and item[0] == "weights":
            self._histograms(item[1], item[2])

    def _loop(self) -> None:
        import tensorflow as tf

        with tf.device("/job:localhost/replica:0/task:0/device:CPU:0"):
            while True:
                item = self._queue.get()
                if item is None:
                    break
                self._write(item)
            final = getattr(self.run, "final_weights", None)
            if final is not None:
                self._histograms(self.history.steps, final)
            for w in self._writers.values():
                w.close()  # flushes; a resumed run opens new event files beside these

    def close(self, timeout: float = 30) -> None:
        """Stop following the run, write what is queued (and the final histograms), flush."""
        self._subscription.close()
        self._queue.put(None)
        self._thread.join(timeout)


def write(run, logdir: str | os.PathLike) -> Path:
    """Write a finished run's (or History's) TensorBoard events under ``<logdir>/<run name>``; returns it.

    For runs trained without ``logdir=``.  A TrainingRun also gets its final
    weights' histograms; a bare History has no weights.
    """
    history = getattr(run, "history", run)
    root = Path(logdir).expanduser() / history.run
    writer = Writer(root, History(history.mode, run=history.run), run=run if run is not history else None)
    records, globals_, _ = history.snapshot()
    for item in records + globals_:
        writer._queue.put(item)
    for step, when, loss in list(history.evals):
        writer._queue.put(Evaluation(step, when, loss, history.run))
    writer.close()
    return root


# -- showing ---------------------------------------------------------------------------------------

_running: dict[Path, TensorBoard] = {}
_lock = threading.Lock()


def _listener_pid(port: int) -> int | None:
    """The pid of the process whose socket listens on ``port`` (None: none whose descriptors we can
    read; another user's socket counts as nobody's)."""
    return holder(listening_inodes(port))


def _own_port(pid: int) -> int | None:
    """The port TensorBoard's HTTP server (``pid`` itself: its data server below it listens on
    another, for gRPC) listens on, once it has bound one."""
    ports = listening_ports({pid})
    return min(ports) if ports else None


def _tree(pid: int) -> set[int]:
    """``pid`` and every process below it."""
    from .procs.tree import descendants

    return {pid, *descendants(pid)}


class TensorBoard:
    """A TensorBoard process for one logdir (owned by this process), and how to display it.

    In a notebook its display is TensorBoard in a frame, through the Jupyter
    server's proxy when there is one; ``url`` is where the page finds it.
    """

    def __init__(self, logdir: Path, error: str = "") -> None:
        self.logdir = logdir
        self.error = error
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    # -- the process (what owner.Owned asks for) --
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """End TensorBoard (SIGTERM, then SIGKILL after 5 s) and reap it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        owner.forget(self)

    stop = kill

    def _start(self, timeout: float) -> None:
        self.log_path = owner.runtime_dir() / f"tensorboard-{time.time_ns()}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _PROGRAM,
                    f"--logdir={self.logdir}",
                    "--host=127.0.0.1",
                    "--port=0",
                    "--reload_interval=2",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        owner.register(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-5:]
                self.error = (
                    f"TensorBoard ended at start (exit code {self.proc.returncode}): "
                    + (" | ".join(tail) or "no output")
                    + f"; its log: {self.log_path}"
                )
                owner.forget(self)
                return
            if self.port is None:
                self.port = _own_port(self.proc.pid)
                if self.port is None:
                    time.sleep(0.2)
                    continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/data/environment", timeout=2):
                    pass
            except OSError:
                time.sleep(0.2)
                continue
            owner_pid = _listener_pid(self.port)
            if owner_pid is not None and owner_pid in _tree(self.proc.pid):
                return
            self.kill()
            who = f"process {owner_pid}" if owner_pid is not None else "a process this user cannot see"
            self.error = (
                f"port {self.port} is held by {who}, not by the TensorBoard tfmagic started: not shown "
                "(what answers there is not TensorBoard). "
                "Run tfmagic.tensorboard.show again, and see who else uses this machine"
            )
            return
        self.kill()
        self.error = f"TensorBoard did not answer within {timeout:g} s; its log: {self.log_path}"

    # -- where the page finds it --
    @property
    def url(self) -> str:
        """``<base_url>proxy/<port>/`` behind a Jupyter server with the proxy, else its own address."""
        proxy = os.environ.get("TENSORBOARD_PROXY_URL")
        if proxy:
            return proxy.replace("%PORT%", str(self.port))
        return f"http://127.0.0.1:{self.port}/"

    def __str__(self) -> str:
        if self.error:
            return self.error
        return f"TensorBoard for {self.logdir} at {self.url} (pid {self.pid})"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        if self.error:
            return f"<div class='tfmagic-tensorboard-error'>{html.escape(self.error)}</div>"
        url = html.escape(self.url, quote=True)
        return (
            f"<div class='tfmagic-tensorboard'><iframe src='{url}' width='100%' height='800' "
            f"frameborder='0'></iframe><div><a href='{url}' target='_blank'>open TensorBoard in a new tab</a>"
            f" ({html.escape(str(self.logdir))})</div></div>"
        )


def show(logdir: str | os.PathLike, timeout: float = 60) -> TensorBoard:
    """TensorBoard for ``logdir``, displayed where it is the cell's result; the same logdir reuses it.

    A logdir that does not exist gives a one-line message instead (``.error``),
    as does a TensorBoard that cannot start (with its log's last lines)::

        run = tfmagic.train(cluster, mode="async", logdir="tb")
        tfmagic.tensorboard.show("tb")
    """
    path = Path(logdir).expanduser().resolve()
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        return TensorBoard(
            path,
            error=f"no TensorBoard logs at {logdir}: the directory {what}. Train with logdir={str(logdir)!r} "
            f"first (tfmagic.train(..., logdir=...) or %tf_train --logdir {logdir})",
        )
    with _lock:
        running = _running.get(path)
        if running is not None and running.alive:
            return running
        board = TensorBoard(path)
        board._start(timeout)
        if not board.error:
            _running[path] = board
        return board
