"""A task process's runtime: its channel to the owner, its role and its server.

Ops arrive on a private copy of standard input and are answered on a private
copy of standard output (:mod:`tfmagic.protocol`); what the task prints goes
to its log.  Urgent ops (:mod:`.probes`) are handled on the reader thread,
even while a cell runs; the others (a role, a cell, a question about the
environment) on the main thread, one at a time.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from .. import protocol
from ..protocol import Event, Op
from . import fdout, probes
from .cells import Cells, NoInput
from .lifeline import ParentWatch, end_now
from .server import ServerCore, serve


def quiet_stdio() -> None:
    """Fd 1 to the log (fd 2) and fd 0 to /dev/null: the process's standard streams carry no channel."""
    os.dup2(2, 1)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


class TaskRuntime:
    """State of this task process: its channel, its role and its server."""

    def __init__(self, channel: tuple[int, int] | None = None, core: ServerCore | None = None) -> None:
        """``channel``: the (ops in, events out) descriptors of a task sharing its process with
        others (:mod:`.host`, which sets the process up once); ``None``: this process's own
        standard input and output, set up here."""
        #: one of several tasks of this process (``processes=``): what is the process's, it leaves alone
        self.shared = channel is not None
        if channel is not None:
            ops_fd, events_fd = channel
            for fd in channel:
                os.set_inheritable(fd, False)  # not a cell's child's: the owner must see our end
            self._out = os.fdopen(events_fd, "wb", buffering=0)
            self._in = os.fdopen(ops_fd, "rb")
        else:
            # The owner reads events from our original stdout and sends ops to our stdin:
            # private copies (not inherited by children), then fd 1 and fd 0 let go of them
            # (quiet_stdio), and sys.stdin an object that refuses to read, so neither a
            # stray print nor a cell (input(), breakpoint()) nor its children reach the channel.
            self._out = os.fdopen(os.dup(1), "wb", buffering=0)
            self._in = os.fdopen(os.dup(0), "rb")
            quiet_stdio()
            sys.stdin = NoInput(self)
        self._out_lock = threading.Lock()
        self.ops: queue.Queue[dict[str, Any]] = queue.Queue()
        self.cells = Cells(self)
        self.handlers: dict[Op, Callable[[dict[str, Any]], None]] = {
            Op.ASSIGN: self.assign,
            Op.ENV: self.report_env,
            Op.EXEC: self.refuse_cell if self.shared else self.cells.run,
            Op.VARIABLES: self.cells.variables,
            Op.PING: lambda msg: self.send(Event.PONG, id=msg.get("id")),
            Op.STOP: lambda msg: self.die("stop requested by the owner", code=0),
        }
        self.server = None
        #: the port the server listens on (the relay's private one with a modelled network)
        self.listen_port: int | None = None
        #: servers cut off by a modelled death (probes.urgent_cut): kept, as TensorFlow cannot free one
        self.cut_servers: list = []
        self.strategy = None  # MultiWorkerMirroredStrategy in collective mode (a cell's ``strategy``)
        self.task: tuple[str, int] | None = None
        self.core: ServerCore | None = core  # TensorFlow's server modules, then its whole API
        self._cpu_only = False
        self._gpus_hidden = False
        self.lifeline = ParentWatch(self.die)
        self.throttle: subprocess.Popen | None = None  # tfmagic.procs.throttle while slowed
        self.slow_factor = 1.0
        self.cluster: dict | None = None

    @property
    def tf(self):
        """TensorFlow's whole Python API, completed on first use (a cell's ``tf``).

        The first use costs what ``import tensorflow`` costs (about 4 s here);
        a task that only serves never pays it.
        """
        tf = self.core.complete()
        if self._cpu_only and not self._gpus_hidden:
            tf.config.set_visible_devices([], "GPU")  # before the eager context starts
            self._gpus_hidden = True
        return tf

    # -- channel ---------------------------------------------------------
    def send(self, event: Event, **fields: Any) -> None:
        fields["event"] = event
        with self._out_lock:
            try:
                protocol.send(self._out, fields)
            except OSError:
                self.die("the owner's end of the channel is closed")

    def die(self, reason: str, code: int = 1) -> None:
        """End this process and everything it started, now (see :func:`~.lifeline.end_now`)."""
        end_now(reason, code)

    @property
    def label(self) -> str:
        """``worker:1`` once this process has a role."""
        return f"{self.task[0]}:{self.task[1]}" if self.task else f"spare task process {os.getpid()}"

    def _read_ops(self) -> None:
        stdin = self._in
        while True:
            try:
                line = stdin.readline()
            except OSError:
                line = b""
            if not line:
                self.die("the owner went away (end of its channel)")
            msg = protocol.decode(line)
            if msg is None or "op" not in msg:
                sys.stderr.write(f"tfmagic task: ignored a malformed message: {line[:200]!r}\n")
                continue
            urgent = probes.HANDLERS.get(msg["op"])
            if urgent is not None:
                try:
                    urgent(self, msg)  # handled on this thread, even while a cell runs
                except Exception as exc:  # noqa: BLE001 - this thread must keep reading: it alone sees the owner go
                    traceback.print_exc(file=sys.__stderr__)  # the log, not the running cell
                    self.send(Event.ERROR, id=msg.get("id"), message=f"{type(exc).__name__}: {exc}")
            else:
                self.ops.put(msg)

    # -- ops -------------------------------------------------------------
    def assign(self, msg: dict[str, Any]) -> None:
        """Take a role: set the environment, then start the TF server."""
        job, index = msg["job"], int(msg["index"])
        log_path = None if self.shared else msg.get("log")  # a shared process keeps one log
        if log_path:
            self._move_log(log_path)
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        print(f"tfmagic: process {os.getpid()} takes the role {job}:{index}", file=sys.__stderr__, flush=True)
        # a shared process has one environment, the one it was started with (CPU only)
        for key, value in ({} if self.shared else msg.get("env") or {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = str(value)
        cluster = msg["cluster"]
        if not self.shared:  # read by a cell's strategy; one task's only
            os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
        self._cpu_only = bool(msg.get("cpu_only"))
        try:
            self.server, self.strategy = serve(self.core, lambda: self.tf, msg, self._cpu_only)
        except Exception as exc:  # noqa: BLE001 - reported to the owner, who decides
            text = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            kind = protocol.PORT_IN_USE if "Could not start gRPC server" in text else "error"
            self.send(Event.ASSIGN_FAILED, kind=kind, message=text)
            return
        self.task = (job, index)
        self.cluster = cluster
        port = int(cluster[job][index].rsplit(":", 1)[1])
        self.listen_port = int(msg.get("bind_port") or port)
        print(
            f"tfmagic: {job}:{index} serving {self.server.target} (port {port})",
            file=sys.__stderr__,
            flush=True,
        )
        if not self.shared:
            fdout.capture()  # fd 1 reaches a running %%tf_px cell from here (a child's output, C code)
        self.send(Event.READY, job=job, index=index, target=self.server.target, port=port)

    @staticmethod
    def _move_log(new_path: str) -> None:
        """A spare's log so far (its TensorFlow import) starts the task's log."""
        try:
            old_path = os.readlink("/proc/self/fd/2")
        except OSError:
            return
        if old_path == new_path or not os.path.isfile(old_path):
            return
        try:
            with open(old_path, "rb") as src, open(new_path, "ab") as dst:
                dst.write(src.read())
            os.unlink(old_path)
        except OSError:
            pass

    def refuse_cell(self, msg: dict[str, Any]) -> None:
        """A ``%%tf_px`` cell needs a process of its own (its namespace, fd 1, signals, a throttle)."""
        self.send(
            Event.EXEC_DONE,
            id=msg.get("id"),
            status="error",
            ename="SharedProcess",
            evalue=(
                f"{self.label} shares process {os.getpid()} with other tasks (processes=): %%tf_px cells "
                "need a process per task; start the cluster without processes= to run cells on its tasks"
            ),
            traceback=[],
        )

    def report_env(self, msg: dict[str, Any]) -> None:
        keys = msg.get("keys") or []
        devices = []
        if msg.get("devices"):
            devices = [d.name for d in self.tf.config.list_logical_devices()]
        self.send(Event.ENV, id=msg.get("id"), env={k: os.environ.get(k) for k in keys}, devices=devices)

    # -- main ------------------------------------------------------------
    def run(self) -> None:
        threading.Thread(target=self._read_ops, name="tfmagic-ops", daemon=True).start()
        if not self.shared:  # a shared process's host watches the parent once
            threading.Thread(target=self.lifeline.run, name="tfmagic-parent", daemon=True).start()
        self.send(
            Event.HELLO,
            pid=os.getpid(),
            host=socket.gethostname(),
            python=sys.version.split()[0],
            bind_host=os.environ.get("TFMAGIC_BIND_HOST"),
            guard_failed=os.environ.get("TFMAGIC_GUARD_FAILED"),
        )
        t0 = time.monotonic()
        try:
            self.core = self.core or ServerCore()
        except Exception as exc:  # noqa: BLE001 - told to the owner, then we end
            traceback.print_exc()
            self.send(
                Event.FATAL,
                message=f"TensorFlow could not be imported by {sys.executable}: {type(exc).__name__}: {exc}",
            )
            self.die("TensorFlow could not be imported")
        version = self.core.version
        print(
            f"tfmagic: process {os.getpid()} imported TensorFlow {version}'s server core "
            f"in {time.monotonic() - t0:.1f} s; waiting for a role",
            flush=True,
        )
        self.send(
            Event.WARM,
            import_s=round(time.monotonic() - t0, 3),
            tf_version=version,
            api=self.core.complete_api,
        )
        while True:
            msg = self.ops.get()
            handler = self.handlers.get(msg["op"])
            if handler is None:
                self.send(Event.ERROR, id=msg.get("id"), message=f"unknown op {msg['op']!r}")
                continue
            try:
                handler(msg)
            except Exception as exc:  # noqa: BLE001 - keep serving; the owner sees the error
                traceback.print_exc()
                self.send(Event.ERROR, id=msg.get("id"), message=f"{type(exc).__name__}: {exc}")


__all__ = ["TaskRuntime", "quiet_stdio"]
