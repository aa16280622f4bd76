"""The program that runs inside every background task process.

Started as ``python -m tfmagic.task_main`` by a launcher (local, SSH, ...),
it imports what a TensorFlow server needs at once (the server core: 0.6 s
and 0.37 GB here, against 4 s and 0.7 GB for all of ``import tensorflow``;
see :class:`ServerCore`), then waits, *warm*, for the owner to give
it a role (``assign``: a job, an index and the whole cluster's addresses).
That split is what makes a second ``%tf_cluster start`` fast: spare
processes have already paid the import and take a role in milliseconds.
TensorFlow's Python API (``tf`` in a ``%%tf_px`` cell) is completed the
first time something in this process needs it.

The process talks to its owner through :mod:`tfmagic.protocol` on its
standard input and a private copy of its standard output; everything the task
prints (TensorFlow's logs included) goes to its log file.  It ends itself and
everything it started (its descendants, also those a cell moved to a session
of their own: the task is their *child subreaper*, so orphans re-parent to it)
when

* its control channel reaches end-of-file (the owner died, even by ``kill -9``:
  the kernel holds the only write end of that pipe), or
* its parent process changes (a local owner died while a forked child of it
  still held the pipe open), or
* its parent dies while it is stopped (``TFMAGIC_PDEATHSIG=1``: the kernel
  sends SIGKILL; a stopped process cannot read end-of-file), or
* the owner sends ``stop``.

The control channel is moved off file descriptor 0 at start-up: a cell's
``input()``, ``breakpoint()`` or child process finds no input (an error that
says so, or ``/dev/null``), never the owner's ops.

It never forks after importing TensorFlow; code that needs another process
must spawn one.
"""

from __future__ import annotations

import ast
import base64
import builtins
import importlib.util
import io
import itertools
import linecache
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from . import protocol
from .errors import TaskHasNoInput
from .proctree import descendants, kill_descendants


class TaskRuntime:
    """State of this task process: its channel, its role and its server."""

    def __init__(self) -> None:
        # The owner reads events from our original stdout; keep a private copy
        # and point fd 1 at stderr (the log) so stray prints cannot corrupt it.
        self._out = os.fdopen(os.dup(1), "wb", buffering=0)
        os.dup2(2, 1)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        # Ops arrive on a private copy of fd 0 (not inherited by children); fd 0
        # itself becomes /dev/null, and sys.stdin an object that refuses to read,
        # so neither a cell (input(), breakpoint()) nor its children can eat ops.
        self._in = os.fdopen(os.dup(0), "rb")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdin = _NoInput(self)
        self._out_lock = threading.Lock()
        self.ops: queue.Queue[dict[str, Any]] = queue.Queue()
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "assign": self.assign,
            "env": self.report_env,
            "exec": self.exec_cell,
            "variables": self.report_variables,
            "ping": lambda msg: self.send("pong", id=msg.get("id")),
            "stop": lambda msg: self.die("stop requested by the owner", code=0),
        }
        self.server = None
        self.task: tuple[str, int] | None = None
        self.core: ServerCore | None = None  # TensorFlow's server modules, then its whole API
        self._cpu_only = False
        self._gpus_hidden = False
        self._parent = os.getppid()
        self._adopted: set[tuple[int, int]] = set()  # (pid, start time) of descendants we did not spawn
        self._throttle: subprocess.Popen | None = None
        self.slow_factor = 1.0
        self.namespace: dict[str, Any] | None = None
        self.current_exec: str | None = None
        self.cancelled: set[str] = set()  # cells interrupted before they started
        #: {cell id: set when every target is ready}: a %%tf_px cell's barrier (``urgent_go``)
        self._go: dict[str, threading.Event] = {}
        self._exec_lock = threading.Lock()
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
    def send(self, event: str, **fields: Any) -> None:
        fields["event"] = event
        with self._out_lock:
            try:
                protocol.send(self._out, fields)
            except OSError:
                self.die("the owner's end of the channel is closed")

    def die(self, reason: str, code: int = 1) -> None:
        """End this process and everything it started, now (see :func:`end_now`)."""
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
            urgent = getattr(self, "urgent_" + msg["op"], None)
            if urgent is not None:
                try:
                    urgent(msg)  # handled on this thread, even while a cell runs
                except Exception as exc:  # noqa: BLE001 - this thread must keep reading: it alone sees the owner go
                    traceback.print_exc(file=sys.__stderr__)  # the log, not the running cell
                    self.send("error", id=msg.get("id"), message=f"{type(exc).__name__}: {exc}")
            else:
                self.ops.put(msg)

    def _watch_parent(self) -> None:
        for tick in itertools.count(1):
            time.sleep(0.5)
            if os.getppid() != self._parent:
                self.die("the owner process is gone (parent changed)")
            if tick % 4 == 0:
                try:
                    self._reap_adopted()
                except Exception:  # noqa: BLE001 - this thread must keep watching the parent
                    traceback.print_exc(file=sys.__stderr__)

    def _reap_adopted(self) -> None:
        """Reap orphans that re-parented to this task (its cells' grandchildren) once they end.

        As child subreaper the task inherits them, and their zombies would stay
        until it ends.  Only descendants seen earlier under another parent are
        reaped: a zombie the task spawned itself belongs to whoever waits for
        it (``subprocess`` would take a stolen status for exit code 0).
        """
        me = os.getpid()
        table = descendants(me)
        for pid, (ppid, state, start) in table.items():
            if ppid == me and state == "Z" and (pid, start) in self._adopted:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except OSError:
                    pass
        seen = {(pid, start) for pid, (_, _, start) in table.items()}
        self._adopted = (self._adopted & seen) | {
            (pid, start) for pid, (ppid, _, start) in table.items() if ppid != me
        }

    # -- urgent ops: handled on the reader thread, even while a cell runs ---
    def urgent_slow(self, msg: dict[str, Any]) -> None:
        """Run at 1/factor speed (``tfmagic.throttle``); factor 1 restores."""
        factor = float(msg.get("factor", 1.0))
        if self._throttle is not None:
            self._throttle.terminate()
            try:
                self._throttle.wait(5)
            except subprocess.TimeoutExpired:
                self._throttle.kill()
            self._throttle = None
            os.kill(os.getpid(), signal.SIGCONT)
        if factor > 1.0:
            self._throttle = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tfmagic.throttle",
                    str(os.getpid()),
                    str(factor),
                    str(msg.get("period_ms", 20.0)),
                ],
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        self.slow_factor = factor
        print(f"tfmagic: running at 1/{factor:g} speed" if factor > 1 else "tfmagic: full speed", flush=True)
        self.send("slowed", id=msg.get("id"), factor=factor)

    def urgent_note(self, msg: dict[str, Any]) -> None:
        """A line for this task's log from its owner: the training engine writes each worker's
        progress here, so the log reads like the seeds' ``worker0.out`` and not only TensorFlow's."""
        text = str(msg.get("text", "")).replace("\n", " ")[:500]
        try:
            sys.__stderr__.write(f"tfmagic: {text}\n")
            sys.__stderr__.flush()
        except (OSError, ValueError):
            pass  # a full or closed log: the note is lost, the task goes on

    def urgent_free_port(self, msg: dict[str, Any]) -> None:
        """A port free on this task's host (remote launchers cannot look themselves)."""
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((msg.get("host") or "", int(msg.get("port") or 0)))
                port = s.getsockname()[1]
        except OSError:
            port = 0  # the port asked about is taken here
        self.send("free_port", id=msg.get("id"), port=port)

    def urgent_stats(self, msg: dict[str, Any]) -> None:
        """CPU %, memory (PSS beside RSS) and uptime of this process, for a remote owner."""
        from .procstats import cpu_percent, memory_of, uptime

        pid = os.getpid()
        mem = memory_of(pid) or {}
        self.send(
            "stats",
            id=msg.get("id"),
            cpu_percent=cpu_percent(pid),
            pss=mem.get("pss"),
            rss=mem.get("rss"),
            uptime_s=uptime(pid),
        )

    def urgent_listening(self, msg: dict[str, Any]) -> None:
        """The TCP addresses this process listens on (the owner checks the bind guard with it)."""
        from .procstats import listening_addresses

        try:
            addresses = [[host, port] for host, port in listening_addresses(os.getpid())]
            self.send("listening", id=msg.get("id"), pid=os.getpid(), addresses=addresses)
        except Exception as exc:  # noqa: BLE001 - the owner must not wait for an answer that never comes
            self.send("listening", id=msg.get("id"), pid=os.getpid(), addresses=None, error=repr(exc))

    def urgent_sockets(self, msg: dict[str, Any]) -> None:
        """This process's TCP connections and the bytes each moved (for the traffic map on other hosts)."""
        from .traffic import own_sockets

        found = [[x.pid, list(x.local), list(x.peer), x.sent, x.received] for x in own_sockets({os.getpid()})]
        self.send("sockets", id=msg.get("id"), sockets=found)

    def urgent_stacks(self, msg: dict[str, Any]) -> None:
        """Every thread's Python stack, as text (why is this task hanging?)."""
        self.send(
            "stacks",
            id=msg.get("id"),
            pid=os.getpid(),
            task=self.label,
            exec_id=self.current_exec,
            threads=thread_stacks(),
            hints=self._cell_hints() if msg.get("hints") else [],
        )

    def _cell_hints(self) -> list[str]:
        """What the running cell's own objects say about a hang, in words (for the hang doctor).

        Two classic TF1 hangs cannot be seen from outside: a cluster spec of
        the cell's own that names an address nothing listens on (the session
        waits for it for ever), and a ``SyncReplicasOptimizer`` that waits for
        more gradients per step than workers run the program.  Both are read
        from the cell's namespace, never by running anything of the cell.
        """
        hints: list[str] = []
        ns = self.namespace or {}
        tf = self.core.module if self.core is not None and self.core.complete_api else None
        if tf is None:
            return hints
        import socket

        mine = {a for addrs in (self.cluster or {}).values() for a in addrs}
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
                        ours = (self.cluster or {}).get(job, [])
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

    def urgent_crash(self, msg: dict[str, Any]) -> None:
        """End now, as a crash would (``cluster.kill`` of a task this owner cannot signal)."""
        self.die("killed on purpose by the owner (a crash, injected)", code=-9)

    def urgent_interrupt(self, msg: dict[str, Any]) -> None:
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

    def urgent_go(self, msg: dict[str, Any]) -> None:
        """Every target of a %%tf_px cell is ready: start its body now (see ``exec_cell``)."""
        self._gate(msg["exec_id"]).set()

    def _gate(self, rid: str) -> threading.Event:
        return self._go.setdefault(rid, threading.Event())  # atomic: no lock (interrupt holds one)

    # -- ops -------------------------------------------------------------
    def assign(self, msg: dict[str, Any]) -> None:
        """Take a role: set the environment, then start the TF server."""
        job, index = msg["job"], int(msg["index"])
        log_path = msg.get("log")
        if log_path:
            self._move_log(log_path)
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        print(f"tfmagic: process {os.getpid()} takes the role {job}:{index}", flush=True)
        for key, value in (msg.get("env") or {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = str(value)
        import json

        cluster = msg["cluster"]
        os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
        core = self.core
        self._cpu_only = bool(msg.get("cpu_only"))
        try:
            threads = msg.get("threads") or {}
            config = core.config_pb2.ConfigProto(
                intra_op_parallelism_threads=int(threads.get("intra", 0)),
                inter_op_parallelism_threads=int(threads.get("inter", 0)),
            )
            if self._cpu_only:
                config.device_count["GPU"] = 0
            if msg.get("collective"):
                self._start_collective(self.tf, cluster, job, index)
            else:
                spec = core.server_lib.ClusterSpec(cluster)
                if msg.get("bind_port"):
                    # A modelled network: the cluster's address for this task is the
                    # relay's (tfmagic.netshape); the server itself listens here.
                    from tensorflow.core.protobuf import tensorflow_server_pb2

                    server_def = tensorflow_server_pb2.ServerDef(
                        cluster=spec.as_cluster_def(),
                        job_name=job,
                        task_index=index,
                        protocol="grpc",
                        default_session_config=config,
                        port=int(msg["bind_port"]),
                    )
                    self.server = core.server_lib.Server(server_def, start=True)
                else:
                    self.server = core.server_lib.Server(
                        spec, job_name=job, task_index=index, protocol="grpc", config=config, start=True
                    )
        except Exception as exc:  # noqa: BLE001 - reported to the owner, who decides
            text = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            kind = protocol.PORT_IN_USE if "Could not start gRPC server" in text else "error"
            self.send(protocol.ASSIGN_FAILED, kind=kind, message=text)
            return
        self.task = (job, index)
        self.cluster = cluster
        port = int(cluster[job][index].rsplit(":", 1)[1])
        print(f"tfmagic: {job}:{index} serving {self.server.target} (port {port})", flush=True)
        self.send(protocol.READY, job=job, index=index, target=self.server.target, port=port)

    def report_variables(self, msg: dict[str, Any]) -> None:
        """The variables ``%%tf_px`` cells left in this task's namespace (and in graphs found there).

        For the placement map: TensorFlow cannot list what a task holds, but
        the cells' own names can be looked through.
        """
        found = []
        if self.namespace is not None and self.core is not None and self.core.complete_api:
            tf = self.tf
            seen = set()
            graphs = [v for v in self.namespace.values() if isinstance(v, tf.Graph)]
            candidates = [v for v in self.namespace.values() if isinstance(v, tf.Variable)]
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
        self.send("variables", id=msg.get("id"), variables=found)

    # -- between-graph cells (%%tf_px) -------------------------------------
    def _namespace(self) -> dict[str, Any]:
        """What a cell finds ready, as the seeds' programs had after their start-up code."""
        if self.namespace is None:
            tf = self.tf
            job, index = self.task or ("?", -1)
            _tune_monitored_session(tf)
            self.namespace = {
                "__name__": "__main__",
                "__builtins__": builtins,
                "tf": tf,
                "cluster": tf.train.ClusterSpec(self.cluster) if self.cluster else None,
                "job_name": job,
                "task_index": index,
                "server": _ServerInCell(self.server),
                "TF_CONFIG": os.environ.get("TF_CONFIG"),
                "report": self.report,
            }
            if getattr(self, "strategy", None) is not None:
                self.namespace["strategy"] = self.strategy
        return self.namespace

    def report(self, step: int | None = None, loss: float | None = None, **metrics: float) -> None:
        """Tell the notebook about a training step (feeds tfmagic's metrics and dashboard).

        ``report(step=global_step, loss=loss_value)`` inside a %%tf_px cell.
        """
        self.send(
            "report",
            exec_id=self.current_exec,
            time=time.time(),
            step=None if step is None else int(step),
            loss=None if loss is None else float(loss),
            metrics={k: float(v) for k, v in metrics.items()},
        )

    def exec_cell(self, msg: dict[str, Any]) -> None:
        """Run a cell's code in this task's namespace, streaming its output."""
        rid = msg["id"]
        code = msg["code"]
        filename = msg.get("filename") or f"<tf_px {self.task}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        ns = self._namespace()  # the first cell's import of TensorFlow's API takes seconds
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
            self.send(
                "exec_done",
                id=rid,
                status="error",
                ename="KeyboardInterrupt",
                evalue="interrupted before it started",
                traceback=[],
            )
            return
        out, err = _StreamToOwner(self, rid, "stdout"), _StreamToOwner(self, rid, "stderr")
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
            out.flush()
            err.flush()
            sys.stdout, sys.stderr = saved
        self.send("exec_done", id=rid, **reply)

    def _prepare_and_wait(self, rid: str, code: str, filename: str, ns: dict[str, Any]) -> None:
        """A %%tf_px barrier: do what is slow, say so, then wait until every target has.

        Between-graph workers that start at different moments do not share the
        work: the first would train alone while the second still imports.  So
        each target first runs the cell's leading imports (TensorFlow's API is
        already complete: ``_namespace``), tells the owner ``exec_ready``, and
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
        self.send("exec_ready", id=rid)
        self._gate(rid).wait()

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

    def _start_collective(self, tf, cluster, job: str, index: int) -> None:
        """Collective mode: MultiWorkerMirroredStrategy starts this task's server itself.

        TF's all-reduce strategy enables collective ops, which starts a gRPC
        server on the task's port inside the eager context; a pre-started
        ``tf.distribute.Server`` on that port would make it fail.  So in this
        mode the task creates the strategy (from TF_CONFIG) instead, and cells
        find it as ``strategy``.
        """
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        self.server = _CollectiveServer(f"grpc://{cluster[job][index]}")

    def report_env(self, msg: dict[str, Any]) -> None:
        keys = msg.get("keys") or []
        devices = []
        if msg.get("devices"):
            devices = [d.name for d in self.tf.config.list_logical_devices()]
        self.send(
            "env",
            id=msg.get("id"),
            env={k: os.environ.get(k) for k in keys},
            devices=devices,
        )

    # -- main ------------------------------------------------------------
    def run(self) -> None:
        threading.Thread(target=self._read_ops, name="tfmagic-ops", daemon=True).start()
        threading.Thread(target=self._watch_parent, name="tfmagic-parent", daemon=True).start()
        self.send(
            protocol.HELLO,
            pid=os.getpid(),
            host=socket.gethostname(),
            python=sys.version.split()[0],
            bind_host=os.environ.get("TFMAGIC_BIND_HOST"),
            guard_failed=os.environ.get("TFMAGIC_GUARD_FAILED"),
        )
        t0 = time.monotonic()
        try:
            self.core = ServerCore()
        except Exception as exc:  # noqa: BLE001 - told to the owner, then we end
            traceback.print_exc()
            self.send(
                protocol.FATAL,
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
            protocol.WARM,
            import_s=round(time.monotonic() - t0, 3),
            tf_version=version,
            api=self.core.complete_api,
        )
        while True:
            msg = self.ops.get()
            handler = self.handlers.get(msg["op"])
            if handler is None:
                self.send("error", id=msg.get("id"), message=f"unknown op {msg['op']!r}")
                continue
            try:
                handler(msg)
            except Exception as exc:  # noqa: BLE001 - keep serving; the owner sees the error
                traceback.print_exc()
                self.send("error", id=msg.get("id"), message=f"{type(exc).__name__}: {exc}")


class _ServerInCell:
    """``server`` as a cell sees it: the task's own server, whose ``join()`` returns.

    The seeds' programs end their ps branch with ``server.join()``; in a task
    process the server keeps serving after the cell ends anyway, so joining
    would only block the cell forever.  Everything else is the real server.
    """

    def __init__(self, server) -> None:
        self._server = server

    def join(self) -> None:
        print("tfmagic: server.join() returns at once here: this task keeps serving after the cell ends.")

    def __getattr__(self, name: str):
        return getattr(self._server, name)

    def __repr__(self) -> str:
        return f"<server of this task: {self._server.target}>"


class _CollectiveServer:
    """What ``server`` is in collective mode: the target of the task's in-process server."""

    def __init__(self, target: str) -> None:
        self.target = target

    def join(self) -> None:
        threading.Event().wait()

    def __repr__(self) -> str:
        return f"<collective-mode server {self.target}>"


class _NoInput:
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

    def __init__(self, runtime: TaskRuntime) -> None:
        self._runtime = runtime

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TaskHasNoInput(
            f"{self._runtime.label}: a %%tf_px cell cannot read input (input(), breakpoint(), pdb): "
            "a task has no keyboard; put the values in the cell"
        )

    read = readline = readlines = read1 = readinto = __next__ = _refuse

    def __iter__(self) -> _NoInput:
        return self

    @property
    def buffer(self) -> _NoInput:
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

    def __init__(self, runtime: TaskRuntime, exec_id: str, name: str) -> None:
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
        self.runtime.send("stream", exec_id=self.exec_id, name=self.name, text=text)

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


#: A private directory holding this task's bind library (see ``_guard_self``), removed at its end.
_guard_tmpdir: str | None = None


def end_now(reason: str, code: int = 1) -> NoReturn:
    """End this process and everything it started, now; nothing here can block.

    The reason goes to the log with one non-blocking ``os.write`` on fd 2: no
    Python stream and no lock, because during a cell ``sys.stderr`` is the
    stream to the owner, whose lock the dying thread may hold itself (a cell
    printing when the channel broke) and whose pipe may be gone.  Then every
    descendant gets SIGKILL (also those in sessions of their own, which a
    group kill misses), then the process group, this process included.
    """
    try:
        os.set_blocking(2, False)
        os.write(2, f"tfmagic task {os.getpid()}: exiting: {reason}\n".encode(errors="replace"))
    except Exception:  # noqa: BLE001 - a full or closed log must not keep us alive
        pass
    kill_descendants()
    if _guard_tmpdir:
        try:
            for name in os.listdir(_guard_tmpdir):
                os.unlink(os.path.join(_guard_tmpdir, name))
            os.rmdir(_guard_tmpdir)
        except OSError:
            pass
    try:
        if os.getpgid(0) == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)  # the leader of its group: nothing may outlive it
    except OSError:
        pass
    if code < 0:  # a crash on purpose (``crash``): die of that signal, as a real one would
        try:
            os.kill(os.getpid(), -code)
        except OSError:
            pass
    os._exit(code)


def thread_stacks() -> list[dict[str, Any]]:
    """Each Python thread's name, ids and current stack as text (main thread first)."""
    threads = {t.ident: t for t in threading.enumerate()}
    me = threading.get_ident()
    found = []
    for ident, frame in sys._current_frames().items():
        thread = threads.get(ident)
        found.append(
            {
                "name": thread.name if thread is not None else f"thread {ident}",
                "ident": ident,
                "native_id": getattr(thread, "native_id", None),
                "daemon": thread.daemon if thread is not None else None,
                "current": ident == me,
                "stack": "".join(traceback.format_stack(frame)),
            }
        )
    found.sort(key=lambda t: (t["name"] != "MainThread", t["name"]))
    return found


_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    """Linux's prctl(2); ``False`` where there is none (other systems) or it fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _tie_to_owner() -> None:
    """First thing a task does: make sure nothing it starts can outlive its owner.

    * Child subreaper: orphans of the cells' processes (a daemon, a child in a
      session of its own whose parent exited) re-parent to this task instead
      of init, so :func:`kill_descendants` finds them when the task ends.
    * ``TFMAGIC_PDEATHSIG=1``: the kernel sends SIGKILL when the parent dies,
      which reaches a stopped (SIGSTOP, a debugger) task that can never read
      end-of-file.  It fires when the parent *thread* exits, so only an owner
      that spawns tasks from a thread living as long as itself sets it.  If
      the parent already died before this line ran (``TFMAGIC_OWNER_PID``, the
      owner's pid, differs from ours) the task ends at once.

    Both are set again after ``_guard_self``'s ``exec``, which keeps them anyway.
    """
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if os.environ.get("TFMAGIC_PDEATHSIG") == "1":
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        owner = os.environ.get("TFMAGIC_OWNER_PID", "")
        if owner.isdigit() and os.getppid() != int(owner):
            end_now(f"the owner (pid {owner}) was gone before this task started")


def _tune_monitored_session(tf) -> None:
    """Documented tfmagic defaults that only make small runs on one machine fast.

    Non-chief workers poll for the chief every 0.1 s:

    A non-chief ``MonitoredTrainingSession`` (through TF's
    ``SessionManager``) that starts before the chief has initialised the
    variables checks again only every ``recovery_wait_secs=30``; on one
    machine that only makes small runs slow.  An explicit argument to
    ``SessionManager`` wins; ``TFMAGIC_RECOVERY_WAIT_SECS`` sets the default.
    """
    import functools

    from tensorflow.python.training import session_manager

    cls = session_manager.SessionManager
    if getattr(cls.__init__, "_tfmagic_tuned", False):
        return
    original = cls.__init__
    wait = float(os.environ.get("TFMAGIC_RECOVERY_WAIT_SECS", "0.1"))

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):  # noqa: N807 - it replaces SessionManager.__init__
        if len(args) < 5:  # recovery_wait_secs is the 5th parameter after self
            kwargs.setdefault("recovery_wait_secs", wait)
        original(self, *args, **kwargs)

    __init__._tfmagic_tuned = True
    cls.__init__ = __init__

    # At the end of a sync run the chief's SyncReplicasOptimizer queue runner
    # waits for gradients that will never come; closing the session then
    # waits stop_grace_period_secs=120 for it.  TFMAGIC_STOP_GRACE_SECS (2).
    grace = float(os.environ.get("TFMAGIC_STOP_GRACE_SECS", "2"))
    train = tf.compat.v1.train
    mts = train.MonitoredTrainingSession

    @functools.wraps(mts)
    def monitored_training_session(*args, **kwargs):
        kwargs.setdefault("stop_grace_period_secs", grace)
        return mts(*args, **kwargs)

    train.MonitoredTrainingSession = monitored_training_session


def _quiet_queue_runner_shutdown(args) -> None:
    """TF1 queue-runner threads die with CancelledError when their session closes
    (SyncReplicasOptimizer's chief queue runner does at every end of training).
    That is expected: keep it in the task's log, out of the cell's output."""
    name = getattr(args.thread, "name", "") or ""
    if name.startswith("QueueRunnerThread") and args.exc_type.__name__ in (
        "CancelledError",
        "OutOfRangeError",
    ):
        try:
            sys.__stderr__.write(
                f"tfmagic: {name} ended with {args.exc_type.__name__} as its session closed\n"
            )
        except (OSError, ValueError):
            pass
        return
    threading.__excepthook__(args)


class ServerCore:
    """TensorFlow's modules a server needs, imported without the rest of its Python API.

    ``import tensorflow`` runs ``tensorflow/__init__.py``, which loads the
    whole Python API: 4 s of CPU and 0.7 GB here, Keras alone 1.5 s of it
    (``python -X importtime -c "import tensorflow"``).  A task's gRPC server
    needs none of that: the kernels and the server are C++, reached through
    ``server_lib``.  So the package module is made from its spec without
    running its body, only the server's modules are imported into it (0.6 s,
    0.37 GB), and :meth:`complete` runs the package's body later, into the
    same module object, when something needs ``tf`` (a ``%%tf_px`` cell).
    On two cores this is what lets three tasks start in less time than one
    ``import tensorflow`` (``python bench/start_time.py``).

    Kernel plugins (``tensorflow-plugins`` directories, pluggable devices)
    are loaded by that body, so where any exist the whole API is imported at
    once instead (``TFMAGIC_FULL_IMPORT=1`` forces that too).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.module = None
        self.spec = importlib.util.find_spec("tensorflow")
        if self.spec is None:
            raise ModuleNotFoundError("No module named 'tensorflow'")
        if "tensorflow" in sys.modules or _has_plugins(self.spec):
            self.module = __import__("tensorflow")
        else:
            package = importlib.util.module_from_spec(self.spec)
            sys.modules["tensorflow"] = package
            try:
                importlib.import_module("tensorflow.python.training.server_lib")
                importlib.import_module("tensorflow.core.protobuf.config_pb2")
            except BaseException:
                sys.modules.pop("tensorflow", None)
                raise
            self._package = package
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.framework import versions
        from tensorflow.python.training import server_lib

        self.config_pb2, self.server_lib, self.version = config_pb2, server_lib, versions.__version__

    @property
    def complete_api(self) -> bool:
        return self.module is not None

    def complete(self):
        """The ``tensorflow`` module with its whole API (imported now if it was not)."""
        with self._lock:
            if self.module is None:
                t0 = time.monotonic()
                self.spec.loader.exec_module(self._package)
                self.module = self._package
                print(
                    f"tfmagic: completed TensorFlow's Python API in {time.monotonic() - t0:.1f} s", flush=True
                )
            return self.module


def _has_plugins(spec) -> bool:
    """Whether ``tensorflow/__init__.py`` would load kernel plugins (see :class:`ServerCore`)."""
    if os.environ.get("TFMAGIC_FULL_IMPORT") or os.environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH"):
        return True
    tf_dir = os.path.dirname(spec.origin or "")
    if os.path.isdir(os.path.join(tf_dir, "core", "kernels")):
        return True
    site_dirs = {os.path.dirname(tf_dir), *(p for p in sys.path if "site-packages" in p)}
    return any(os.path.isdir(os.path.join(d, "tensorflow-plugins")) for d in site_dirs)


def _guard_self() -> None:
    """Keep this task's servers on one address, on whatever host it runs.

    A remote launcher cannot hand the task a preload library built on the
    owner's machine (another host may have another libc), so it sets
    ``TFMAGIC_GUARD_HOST`` and the task builds the library on its own host and
    re-executes itself with it, before TensorFlow is imported (``exec`` keeps
    the pid and the owner's channel).  When that is not possible here the
    reason travels in the ``hello`` event and the owner tells the user.
    """
    host = os.environ.get("TFMAGIC_GUARD_HOST")
    if not host or os.environ.get("TFMAGIC_BIND_HOST"):
        return
    from .loopback import bind_guard, built_privately

    guard = bind_guard(host)
    if not guard.available:
        os.environ["TFMAGIC_GUARD_FAILED"] = guard.reason
        return
    env = {**os.environ, **guard.env}
    if built_privately(guard.library):
        # Built privately (this host's cache could be written by others); ``exec``
        # skips the exit handler that would remove it, so the task does at its end.
        env["TFMAGIC_GUARD_TMPDIR"] = os.path.dirname(guard.library)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-u", "-m", "tfmagic.task_main"], env)


def _start_keeper() -> None:
    """A keeper beside this task ends what the task started if the task is killed outright.

    ``PR_SET_PDEATHSIG`` SIGKILLs a task whose owner died while it could not
    read its channel (stopped); a SIGKILLed task cannot end its children, and
    those a cell started in sessions of their own would live on.  The keeper
    (:mod:`tfmagic.proctree`) does it.  Started before TensorFlow is imported.
    """
    subprocess.Popen(
        [sys.executable, "-m", "tfmagic.proctree", str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        close_fds=True,
    )


def main() -> None:
    global _guard_tmpdir
    _tie_to_owner()
    _guard_self()
    if os.environ.get("TFMAGIC_PDEATHSIG") == "1":
        _start_keeper()
    _guard_tmpdir = os.environ.pop("TFMAGIC_GUARD_TMPDIR", None)
    for key in ("TFMAGIC_PDEATHSIG", "TFMAGIC_OWNER_PID"):
        os.environ.pop(key, None)  # meant for this process, not for what its cells start
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.excepthook = _quiet_queue_runner_shutdown
    TaskRuntime().run()


if __name__ == "__main__":
    main()
