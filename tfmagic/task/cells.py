"""Between-graph cells (``%%tf_px``) inside a task: their namespace, their run, their output.

A cell runs in one namespace per task that lives as long as the task: what
the seeds' programs had after their start-up code (``tf``, ``cluster``,
``job_name``, ``task_index``, ``server``, ``report``).  Its output streams
to the owner line by line (and to the task's log).  A cell sent with a
barrier first does what is slow, says so, and waits until every target has
(:meth:`Cells._prepare_and_wait`), so between-graph workers start together.
The task's ``sys.stdin`` refuses to read (:class:`NoInput`): its real
standard input was the owner's channel.
"""

from __future__ import annotations

import ast
import base64
import builtins
import io
import linecache
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

from ..errors import TaskHasNoInput
from ..protocol import Event
from . import fdout
from .server import ServerInCell, tune_monitored_session


class Cells:
    """The cells of one task (``rt``: its runtime: channel, role, server)."""

    def __init__(self, rt) -> None:
        self.rt = rt
        self.ns: dict[str, Any] | None = None
        self.current_exec: str | None = None
        self.cancelled: set[str] = set()  # cells interrupted before they started
        #: {cell id: set when every target is ready}: a %%tf_px cell's barrier (``go``)
        self._go: dict[str, threading.Event] = {}
        self._exec_lock = threading.Lock()

    def hints(self) -> list[str]:
        """What the running cell's own objects say about a hang, in words (for the hang doctor).

        Two classic TF1 hangs cannot be seen from outside: a cluster spec of
        the cell's own that names an address nothing listens on (the session
        waits for it for ever), and a ``SyncReplicasOptimizer`` that waits for
        more gradients per step than workers run the program.  Both are read
        from the cell's namespace, never by running anything of the cell.
        """
        hints: list[str] = []
        ns = self.ns or {}
        tf = self.rt.core.module if self.rt.core is not None and self.rt.core.complete_api else None
        if tf is None:
            return hints
        import socket

        mine = {a for addrs in (self.rt.cluster or {}).values() for a in addrs}
        specs = [v for v in list(ns.values()) if isinstance(v, tf.train.ClusterSpec)]
        for spec in specs:
            for job, addrs in spec.as_dict().items():
                items = addrs.items() if isinstance(addrs, dict) else enumerate(addrs)
                for index, addr in items:
                    if addr in mine:
                        continue
                    host, _, port = str(addr).rpartition(":")
                    try:
                        socket.create_connection((host or "127.0.0.1", int(port)), timeout=0.3).close()
                    except (OSError, ValueError):
                        ours = (self.rt.cluster or {}).get(job, [])
                        real = ours[int(index)] if int(index) < len(ours) else "not in this cluster"
                        hints.append(
                            f"the cell's cluster spec names {job}:{index} at {addr}, where nothing listens "
                            f"(the cluster's {job}:{index}: {real})"
                        )
        sync = getattr(tf.compat.v1.train, "SyncReplicasOptimizer", None)
        for v in list(ns.values()):
            if sync is not None and isinstance(v, sync):
                hints.append(
                    f"SyncReplicasOptimizer aggregates {v._replicas_to_aggregate} gradients per step "
                    f"(total_num_replicas={v._total_num_replicas}): a step waits until that many have arrived"
                )
        return hints

    def interrupt(self, msg: dict[str, Any]) -> None:
        """Raise KeyboardInterrupt in the running cell (if it is still that cell)."""
        with self._exec_lock:
            if self.current_exec is not None and msg.get("exec_id") in (None, self.current_exec):
                # At the main thread: raised here, on the reader thread, the signal
                # would wait for the cell's blocking call (time.sleep, a join) to return.
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            elif msg.get("exec_id"):
                # Not started yet (the task is still importing what the cell needs,
                # or waits at the cell's barrier): it must not start at all, or the
                # interrupt would be lost.
                self.cancelled.add(msg["exec_id"])
                self._gate(msg["exec_id"]).set()

    def go(self, msg: dict[str, Any]) -> None:
        """Every target of a %%tf_px cell is ready: start its body now (see :meth:`run`)."""
        self._gate(msg["exec_id"]).set()

    def variables(self, msg: dict[str, Any]) -> None:
        """The variables ``%%tf_px`` cells left in this task's namespace (and in graphs found there).

        For the placement map: TensorFlow cannot list what a task holds, but
        the cells' own names can be looked through.
        """
        found = []
        if self.ns is not None and self.rt.core is not None and self.rt.core.complete_api:
            tf = self.rt.tf
            seen = set()
            graphs = [v for v in self.ns.values() if isinstance(v, tf.Graph)]
            candidates = [v for v in self.ns.values() if isinstance(v, tf.Variable)]
            for g in graphs:
                candidates.extend(g.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES))
            for v in candidates:
                if id(v) in seen:
                    continue
                seen.add(id(v))
                try:
                    shape = [int(d) if d is not None else 0 for d in v.shape.as_list()]
                    size = int(v.dtype.size) * int(v.shape.num_elements() or 0)
                    device = v.device or ""
                except Exception:  # noqa: BLE001 - a variable we cannot read is left out
                    continue
                task = None  # this task's own (an eager variable here says /job:localhost)
                if "/job:" in device and "/job:localhost" not in device:
                    job = device.split("/job:")[1].split("/")[0]
                    index = device.split("/task:")[1].split("/")[0] if "/task:" in device else "0"
                    task = f"{job}:{index}"
                found.append(
                    {
                        "name": v.name.split(":")[0],
                        "shape": shape,
                        "dtype": v.dtype.name,
                        "bytes": size,
                        "task": task,
                    }
                )
        self.rt.send(Event.VARIABLES, id=msg.get("id"), variables=found)

    def namespace(self) -> dict[str, Any]:
        """What a cell finds ready, as the seeds' programs had after their start-up code."""
        if self.ns is None:
            tf = self.rt.tf
            job, index = self.rt.task or ("?", -1)
            tune_monitored_session(tf)
            self.ns = {
                "__name__": "__main__",
                "__builtins__": builtins,
                "tf": tf,
                "cluster": tf.train.ClusterSpec(self.rt.cluster) if self.rt.cluster else None,
                "job_name": job,
                "task_index": index,
                "server": ServerInCell(self.rt.server),
                "TF_CONFIG": os.environ.get("TF_CONFIG"),
                "report": self.report,
            }
            if self.rt.strategy is not None:
                self.ns["strategy"] = self.rt.strategy
        return self.ns

    def report(self, step: int | None = None, loss: float | None = None, **metrics: float) -> None:
        """Tell the notebook about a training step (feeds tfmagic's metrics and dashboard).

        ``report(step=global_step, loss=loss_value)`` inside a %%tf_px cell.
        """
        self.rt.send(
            Event.REPORT,
            exec_id=self.current_exec,
            time=time.time(),
            step=None if step is None else int(step),
            loss=None if loss is None else float(loss),
            metrics={k: float(v) for k, v in metrics.items()},
        )

    def run(self, msg: dict[str, Any]) -> None:
        """Run a cell's code in this task's namespace, streaming its output."""
        rid = msg["id"]
        code = msg["code"]
        filename = msg.get("filename") or f"<tf_px {self.rt.task}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        ns = self.namespace()  # the first cell's import of TensorFlow's API takes seconds
        if msg.get("barrier"):
            self._prepare_and_wait(rid, code, filename, ns)
        with self._exec_lock:
            self._go.pop(rid, None)
            cancelled = rid in self.cancelled
            self.cancelled.discard(rid)
            if not cancelled:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                self.current_exec = rid
        if cancelled:
            self.rt.send(
                Event.EXEC_DONE,
                id=rid,
                status="error",
                ename="KeyboardInterrupt",
                evalue="interrupted before it started",
                traceback=[],
            )
            return
        out, err = _StreamToOwner(self.rt, rid, "stdout"), _StreamToOwner(self.rt, rid, "stderr")
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        reply: dict[str, Any] = {"status": "ok"}
        try:
            tree = ast.parse(code, filename=filename)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec"), ns)
            if last is not None:
                value = eval(compile(last, filename, "eval"), ns)
                if value is not None:
                    reply["repr"] = repr(value)[:10000]
                    try:
                        reply["pickle"] = base64.b64encode(pickle.dumps(value)).decode()
                    except Exception:  # noqa: BLE001 - the repr will do
                        pass
        except BaseException as exc:  # noqa: BLE001 - reported to the owner, the task goes on
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != filename:
                tb = tb.tb_next  # hide this file's frames: show the user's own lines
            if isinstance(exc, SyntaxError):
                lines = traceback.format_exception_only(type(exc), exc)
            else:
                lines = traceback.format_exception(type(exc), exc, tb)
            reply = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": lines}
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            self.current_exec = None
            fdout.drain()  # what the cell (or a child of it) wrote to fd 1 just before the end
            out.flush()
            err.flush()
            sys.stdout, sys.stderr = saved
        self.rt.send(Event.EXEC_DONE, id=rid, **reply)

    def _prepare_and_wait(self, rid: str, code: str, filename: str, ns: dict[str, Any]) -> None:
        """A %%tf_px barrier: do what is slow, say so, then wait until every target has.

        Between-graph workers that start at different moments do not share the
        work: the first would train alone while the second still imports.  So
        each target first runs the cell's leading imports (TensorFlow's API is
        already complete: :meth:`namespace`), tells the owner ``exec_ready``, and
        starts the body only when the owner says ``go`` (every target ready,
        or gone).  An import that fails here fails again, visibly, in the body.
        """
        try:
            tree = ast.parse(code, filename=filename)
        except SyntaxError:
            tree = None
        leading = []
        for node in tree.body if tree is not None else []:
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                break
            leading.append(node)
        if leading:
            saved = sys.stdout, sys.stderr
            sys.stdout = sys.stderr = io.StringIO()  # the body's run shows what they print
            try:
                exec(compile(ast.Module(body=leading, type_ignores=[]), filename, "exec"), ns)
            except BaseException:  # noqa: BLE001 - the body runs them again and reports the error
                pass
            finally:
                sys.stdout, sys.stderr = saved
        self.rt.send(Event.EXEC_READY, id=rid)
        self._gate(rid).wait()

    def _gate(self, rid: str) -> threading.Event:
        return self._go.setdefault(rid, threading.Event())  # atomic: no lock (interrupt holds one)


class NoInput:
    """``sys.stdin`` of a task: reading it fails with a one-line error saying why.

    The task's real standard input was its owner's control channel; a cell
    reading it (``input()``, ``breakpoint()``, ``sys.stdin.read()``) would eat
    the owner's ops and wedge the task for good.  ``fileno()`` is 0, which is
    ``/dev/null`` by then (what the cell's child processes read).
    """

    encoding = "utf-8"
    errors = "strict"
    newlines = None
    closed = False
    name = "<stdin of a tfmagic task: no input>"

    def __init__(self, runtime) -> None:
        self._runtime = runtime

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TaskHasNoInput(
            f"{self._runtime.label}: a %%tf_px cell cannot read input (input(), breakpoint(), pdb): "
            "a task has no keyboard; put the values in the cell"
        )

    read = readline = readlines = read1 = readinto = __next__ = _refuse

    def __iter__(self) -> NoInput:
        return self

    @property
    def buffer(self) -> NoInput:
        return self

    def fileno(self) -> int:
        return 0

    def isatty(self) -> bool:
        return False

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        pass


class _StreamToOwner:
    """sys.stdout/sys.stderr during a cell: each line goes to the owner (and the log)."""

    def __init__(self, runtime, exec_id: str, name: str) -> None:
        self.runtime = runtime
        self.exec_id = exec_id
        self.name = name
        self._buf = ""
        self._lock = threading.Lock()
        self._log = sys.__stderr__

    def write(self, text: str) -> int:
        with self._lock:
            self._buf += text
            if "\n" in self._buf:
                head, _, self._buf = self._buf.rpartition("\n")
                self._emit(head + "\n")
        return len(text)

    def _emit(self, text: str) -> None:
        try:
            self._log.write(text)
            self._log.flush()
        except (OSError, ValueError):
            pass
        self.runtime.send(Event.STREAM, exec_id=self.exec_id, name=self.name, text=text)

    def flush(self) -> None:
        with self._lock:
            if self._buf:
                self._emit(self._buf)
                self._buf = ""

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return "utf-8"

    @property
    def buffer(self) -> _BytesToOwner:
        """``sys.stdout.buffer``: bytes written there reach the cell too (decoded as UTF-8)."""
        if not hasattr(self, "_bytes"):
            self._bytes = _BytesToOwner(self)
        return self._bytes


class _BytesToOwner:
    """The binary side of :class:`_StreamToOwner` (a character split between writes is kept)."""

    def __init__(self, text: _StreamToOwner) -> None:
        import codecs

        self._text = text
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, data: bytes) -> int:
        self._text.write(self._decoder.decode(bytes(data)))
        return len(data)

    def flush(self) -> None:
        self._text.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False


__all__ = ["Cells", "NoInput"]
