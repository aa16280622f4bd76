"""Task processes as Spark tasks: one barrier job runs the whole cluster.

``SparkCluster("local[3]", ps=1, workers=2)`` (or ``%tf_cluster start
--backend spark --master spark://host:7077``) submits one Spark job in
*barrier mode* with one Spark task per TensorFlow task.  Barrier mode is
Spark's gang scheduling: all tasks start together or none does, and if one
fails Spark kills the others, so a half-started cluster cannot hang around.
The application and its job show in the Spark UI as long as the cluster runs.

Each Spark task runs a small relay (:mod:`tfmagic.launchers.spark_task`) that
connects back to a listener in this process, authenticates, and starts the
TensorFlow task process as its child; from then on the task speaks
:mod:`tfmagic.protocol` to this process exactly as a local task does over its
pipes, and its log is written to a file on *this* machine.

Lifetimes, all tested:

* ``cluster.stop()`` ends each task, the relays return, the job finishes, and
  the Spark application this launcher created ends too.
* The Spark job cancelled (Spark UI's *kill*, ``sc.cancelJobGroup``): Spark
  kills the relays, the tasks read end-of-file on their standard input and end.
* The driver (this process) dies, even by ``kill -9``: the relays' connections
  end and so do the tasks, within a second; the executors end the relays.

Security: the control channel carries code (``%%tf_px``), so only relays that
prove they hold a per-cluster secret are accepted (HMAC challenge-response
over nonces from both sides, compared with :func:`hmac.compare_digest`); the
secret travels inside the Spark closure, never on a command line.  Anyone
else who connects is refused and logged (``launcher.refused``).  The channel
is authenticated, not encrypted: on a network you do not trust, also turn on
Spark's own ``spark.authenticate`` and ``spark.network.crypto.enabled``.  The
TensorFlow servers themselves run any graph sent to them; each is kept on the
one address its spec names (the bind guard, built on its own host) unless
``guard=False``.

Why no fork-after-TensorFlow here: this process (the notebook kernel) may
have imported TensorFlow.  The Spark JVM is started with a plain
``subprocess`` spawn (pyspark's own launcher runs Python code in the forked
child), Spark's Python workers are forked by Spark's daemon (started by the
JVM), and the relay starts the task with ``subprocess``.
"""

from __future__ import annotations

import functools
import hmac
import itertools
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ClusterStartError
from . import spark_task
from .base import Launcher
from .channel import TaskProcess
from .process import PACKAGE_PARENT, TASK_ENV, read_tail

log = logging.getLogger("tfmagic.spark")

INSTALL_HINT = "pip install 'tfmagic[spark]'"

#: Settings every context this launcher creates gets (``conf=`` overrides them).
DEFAULT_CONF = {
    # A fresh Python worker per Spark task: nothing of a task outlives it.
    "spark.python.worker.reuse": "false",
    # Without these a barrier stage waits 15 s per check for executors.
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.ui.showConsoleProgress": "false",
}

_ids = itertools.count(1)
_fake_pids = itertools.count(-1, -1)


def _is_loopback_master(master: str) -> bool:
    if master.startswith("local"):
        return True
    if master.startswith("spark://"):
        hosts = master[len("spark://") :].split(",")
        return all(h.rsplit(":", 1)[0] in ("127.0.0.1", "localhost", "[::1]") for h in hosts)
    return False


def _local_slots(master: str) -> int | None:
    """Task slots of a ``local[N]`` master (``None``: not local, or not known here)."""
    if master == "local":
        return 1
    if master.startswith("local[") and master.endswith("]"):
        n = master[len("local[") : -1].split(",")[0].strip()
        if n == "*":
            return os.cpu_count() or 1
        try:
            return int(n)
        except ValueError:
            return None
    return None


def _spark_error_summary(exc: BaseException) -> str:
    """The line of a (long, Java) Spark error that says what went wrong."""
    text = str(exc)
    if "SPARK-24819" in text or "BarrierJobSlotsNumberCheckFailed" in text:
        return "the Spark cluster has fewer free task slots (cores) than this job has tasks"
    for line in text.splitlines():
        line = line.strip().lstrip(": ")
        if line and not line.startswith(("at ", "Traceback", "File ")):
            return line[:500]
    return type(exc).__name__


# -- the Spark context ------------------------------------------------------------


class _Context:
    """A SparkContext and whether (and how often) tfmagic holds it."""

    def __init__(self, sc, owned: bool, jvm: subprocess.Popen | None, log_path: str | None) -> None:
        self.sc = sc
        self.owned = owned
        self.jvm = jvm
        self.log_path = log_path
        self.users = 0


_contexts_lock = threading.Lock()
_shared: _Context | None = None


def _import_pyspark():
    try:
        import pyspark
    except ImportError:
        raise ClusterStartError(
            f"the Spark backend needs pyspark, which is not installed here: {INSTALL_HINT}"
        )
    import pyspark

    return pyspark


def _check_java() -> None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return
    if shutil.which("java") is None:
        raise ClusterStartError(
            "Spark needs Java (17 or newer for Spark 4) and there is no `java` here: "
            "apt-get install default-jre-headless (or set JAVA_HOME)"
        )


def _launch_jvm(
    conf_pairs: list[tuple[str, str]], env: dict[str, str], log_path: str, timeout: float = 120.0
):
    """Start Spark's JVM ourselves and return ``(py4j gateway, Popen)``.

    pyspark's own ``launch_gateway`` runs Python code in the forked child
    (``preexec_fn``), which is not safe in a process that has imported
    TensorFlow; it also sends the JVM's chatter to the kernel's stderr.  This
    is the same start without those: ``spark-submit pyspark-shell`` in its own
    session (so a notebook interrupt does not reach it), with its output in a
    log file; the JVM ends itself when its standard input (held here) closes.
    """
    from pyspark.find_spark_home import _find_spark_home
    from pyspark.java_gateway import launch_gateway
    from pyspark.serializers import UTF8Deserializer, read_int

    spark_home = _find_spark_home()
    command = [os.path.join(spark_home, "bin", "spark-submit")]
    for key, value in conf_pairs:
        command += ["--conf", f"{key}={value}"]
    command.append("pyspark-shell")
    conn_dir = tempfile.mkdtemp(prefix="tfmagic-spark-")
    conn_file = os.path.join(conn_dir, "conn")
    full_env = {**os.environ, **env, "SPARK_CONNECT_MODE": "0", "_PYSPARK_DRIVER_CONN_INFO_PATH": conn_file}
    full_env.pop("PYSPARK_GATEWAY_PORT", None)
    full_env.pop("PYSPARK_GATEWAY_SECRET", None)
    try:
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=out,
                env=full_env,
                start_new_session=True,
                close_fds=True,
            )
        deadline = time.monotonic() + timeout
        while not os.path.isfile(conn_file):
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                tail = read_tail(log_path, 8).strip()
                raise ClusterStartError(
                    f"Spark's JVM did not start (exit code {proc.returncode}); its output ends:\n{tail}"
                )
            time.sleep(0.05)
        with open(conn_file, "rb") as info:
            port = read_int(info)
            secret = UTF8Deserializer().loads(info)
    finally:
        shutil.rmtree(conn_dir, ignore_errors=True)
    saved = {k: os.environ.get(k) for k in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    os.environ["PYSPARK_GATEWAY_PORT"] = str(port)
    os.environ["PYSPARK_GATEWAY_SECRET"] = secret
    try:
        gateway = launch_gateway()
    except BaseException:
        _end_jvm(proc)
        raise
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    gateway.proc = proc
    return gateway, proc


def _end_jvm(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """End a JVM we started: close its standard input (it exits), kill it if it does not."""
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _acquire_context(master: str, app_name: str, conf: dict[str, str], loopback: bool) -> _Context:
    """The context for ``master``: tfmagic's shared one, the user's active one, or a new one."""
    global _shared
    _import_pyspark()
    from pyspark import SparkConf, SparkContext

    with _contexts_lock:
        active = SparkContext._active_spark_context
        if _shared is not None and active is _shared.sc:
            ctx = _shared
        elif active is not None:
            ctx = _Context(active, owned=False, jvm=None, log_path=None)
        else:
            _check_java()
            pairs = {"spark.master": master, "spark.app.name": app_name, **DEFAULT_CONF}
            env = {}
            if loopback:
                # The driver's RPC, block manager and UI on loopback only.
                pairs.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
                env["SPARK_LOCAL_IP"] = "127.0.0.1"
            pairs.update(conf)
            from .. import owner

            log_path = str(owner.runtime_dir() / f"spark-driver-{next(_ids)}.log")
            spark_conf = SparkConf(loadDefaults=False)
            for key, value in pairs.items():
                spark_conf.set(key, value)
            jvm = None
            if SparkContext._gateway is None:
                try:
                    SparkContext._gateway, jvm = _launch_jvm(sorted(pairs.items()), env, log_path)
                    SparkContext._jvm = SparkContext._gateway.jvm
                except (ImportError, AttributeError) as exc:  # another pyspark's internals
                    log.warning("starting Spark's JVM the pyspark way (%s)", exc)
            try:
                sc = SparkContext(conf=spark_conf)
            except BaseException:
                if jvm is not None:
                    SparkContext._gateway = SparkContext._jvm = None
                    _end_jvm(jvm)
                raise
            sc.setLogLevel("WARN")
            ctx = _shared = _Context(sc, owned=True, jvm=jvm, log_path=log_path)
        if ctx.sc.master != master:
            raise ClusterStartError(
                f"this process already runs a SparkContext for {ctx.sc.master}, and a process can hold "
                f"only one; use master={ctx.sc.master!r}, or stop that context first"
            )
        ctx.users += 1
        return ctx


def _release_context(ctx: _Context) -> None:
    """One user fewer; the last one stops a context tfmagic created (and its JVM)."""
    global _shared
    with _contexts_lock:
        ctx.users -= 1
        if ctx.users > 0 or not ctx.owned:
            return
        if _shared is ctx:
            _shared = None
        from pyspark import SparkContext

        try:
            ctx.sc.stop()
        except Exception as exc:  # noqa: BLE001 - ending anyway
            log.warning("stopping the SparkContext failed: %s", exc)
        if ctx.jvm is not None:
            gateway = SparkContext._gateway
            SparkContext._gateway = SparkContext._jvm = None
            try:
                gateway.shutdown()
            except Exception:  # noqa: BLE001 - the JVM goes anyway
                pass
            _end_jvm(ctx.jvm)


# -- slots and batches ------------------------------------------------------------


@dataclass
class _Slot:
    """One task process being (or having been) served by one relay."""

    batch: _Batch
    index: int
    log_path: str
    control: socket.socket | None = None
    log_sock: socket.socket | None = None
    relay_pid: int | None = None
    attempt: int | None = None
    hostname: str | None = None
    address: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    error: str | None = None
    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def note(self, text: str) -> None:
        try:
            with open(self.log_path, "ab") as f:
                f.write(f"tfmagic: spark: {text}\n".encode())
        except OSError:
            pass

    def close(self) -> None:
        for sock in (self.control, self.log_sock):
            if sock is None:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


@dataclass
class _Batch:
    """One Spark job serving some task slots."""

    id: str
    group: str
    description: str
    barrier: bool
    slots: list[_Slot] = field(default_factory=list)
    result: list | None = None
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    closed: bool = False


# -- the launcher ----------------------------------------------------------------------


class SparkLauncher(Launcher):
    """Runs each task as a Spark task: the cluster is one barrier job of a Spark application.

    Parameters
    ----------
    master:
        A Spark master URL: ``local[N]`` (N at least the number of tasks),
        ``spark://HOST:PORT`` (standalone), or what your Spark supports.
    app_name:
        The application's name in the Spark UI.
    conf:
        More Spark settings (``{"spark.executor.memory": "4g"}``); they win
        over tfmagic's defaults.
    python:
        The Python the executors run (``spark.pyspark.python``); it must have
        TensorFlow and tfmagic installed, and the same minor version as this
        one.  This interpreter by default.
    spark:
        A ``SparkSession`` or ``SparkContext`` you already have: it is used
        instead of a new one, and left running at the end.
    env:
        Extra environment for every task process.
    guard:
        Keep each TensorFlow server on the one address its spec names (built
        on its own host; see :mod:`tfmagic.loopback`).
    connect_timeout:
        Seconds Spark may take to start the tasks and their relays to connect.

    >>> launcher = SparkLauncher("spark://head:7077", python="/opt/venv/bin/python")  # doctest: +SKIP
    >>> cluster = tfmagic.Cluster(ps=1, workers=2, launcher=launcher)                 # doctest: +SKIP
    """

    name = "spark"

    def __init__(
        self,
        master: str = "local[3]",
        *,
        app_name: str = "tfmagic",
        conf: dict[str, Any] | None = None,
        python: str = sys.executable,
        spark: Any = None,
        env: dict[str, str | None] | None = None,
        guard: bool = True,
        connect_timeout: float = 180.0,
    ) -> None:
        self._given = getattr(spark, "sparkContext", spark)
        if self._given is not None:
            master = self._given.master
        self.master = master
        self.app_name = app_name
        self.python = python
        self.user_conf = {str(k): str(v) for k, v in (conf or {}).items()}
        self.extra_env = dict(env or {})
        self.guard = guard
        self.connect_timeout = connect_timeout
        self.loopback = _is_loopback_master(master)
        self._secret = secrets.token_bytes(32)
        self._ctx: _Context | None = None
        self._listener: socket.socket | None = None
        self._lock = threading.RLock()
        self._batches: dict[str, _Batch] = {}
        self._by_pid: dict[int, _Slot] = {}
        self._client_address: str | None = None
        #: Connections refused: ``(time, peer, reason)``, newest last.
        self.refused: list[tuple[float, str, str]] = []

    # -- placement ----------------------------------------------------------------
    @property
    def host(self) -> str:  # type: ignore[override]
        """The address the relays connect back to (this process, the Spark driver)."""
        if self.loopback:
            return "127.0.0.1"
        if self._ctx is not None:
            return self._ctx.sc.getConf().get("spark.driver.host") or socket.gethostname()
        return socket.gethostname()

    @property
    def signature(self) -> tuple:
        return (self.name, self.master, self.python)

    def placement(self) -> tuple:
        return (self.name, self.master)

    def describe(self) -> str:
        return f" on Spark {self.master}"

    def hosts_for(self, count: int) -> list[str]:
        # Spark places the tasks; each one's address is known when its relay connects.
        return ["spark"] * count

    # -- Spark ----------------------------------------------------------------------
    @property
    def context(self):
        """The SparkContext the tasks run in (created on first use)."""
        return self._context().sc

    def _context(self) -> _Context:
        with self._lock:
            if self._ctx is None:
                if self._given is not None:
                    self._ctx = _Context(self._given, owned=False, jvm=None, log_path=None)
                    self._ctx.users = 1
                else:
                    conf = {"spark.pyspark.python": self.python, **self.user_conf}
                    self._ctx = _acquire_context(self.master, self.app_name, conf, self.loopback)
            return self._ctx

    @property
    def ui_url(self) -> str | None:
        """The Spark UI of the application (``None`` before it starts)."""
        return self._ctx.sc.uiWebUrl if self._ctx is not None else None

    def _listen(self) -> tuple[str, int]:
        with self._lock:
            if self._listener is None:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self._bind_address(), 0))
                sock.listen(64)
                self._listener = sock
                threading.Thread(
                    target=self._accept, args=(sock,), name="tfmagic-spark-listen", daemon=True
                ).start()
            return self.host, self._listener.getsockname()[1]

    def _bind_address(self) -> str:
        """Where the listener binds: loopback for local masters, else the driver's own address."""
        if self.loopback:
            return "127.0.0.1"
        try:
            return socket.gethostbyname(self.host)
        except OSError:
            return ""

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, peer = listener.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._handshake,
                args=(conn, f"{peer[0]}:{peer[1]}"),
                name="tfmagic-spark-conn",
                daemon=True,
            ).start()

    def _refuse(self, conn: socket.socket, peer: str, reason: str) -> None:
        self.refused.append((time.time(), peer, reason))
        del self.refused[:-100]
        log.warning("tfmagic spark listener: refused a connection from %s: %s", peer, reason)
        conn.close()

    def _handshake(self, conn: socket.socket, peer: str) -> None:
        """Authenticate one connection (mutually), then hand it to its slot."""
        try:
            conn.settimeout(spark_task.HANDSHAKE_TIMEOUT)
            nonce = secrets.token_bytes(32)
            conn.sendall(spark_task.GREETING + b" " + nonce.hex().encode() + b"\n")
            line = spark_task.read_line(conn, limit=200).decode("ascii", "replace")
            their_hex, _, proof = line.partition(" ")
            try:
                theirs = bytes.fromhex(their_hex)
            except ValueError:
                theirs = b""
            expected = spark_task.mac(self._secret, b"relay", nonce, theirs)
            if len(theirs) != 32 or not hmac.compare_digest(proof.encode(), expected.encode()):
                self._refuse(conn, peer, "it does not know the cluster's secret")
                return
            conn.sendall(spark_task.mac(self._secret, b"driver", theirs, nonce).encode() + b"\n")
            hello = json.loads(spark_task.read_line(conn))
            if not isinstance(hello, dict):
                raise ValueError("the introduction is not a JSON object")
        except (OSError, ValueError, ConnectionError) as exc:
            self._refuse(conn, peer, f"handshake failed ({type(exc).__name__}: {exc})")
            return
        slot, why = self._claim(hello, conn)
        try:
            conn.sendall(json.dumps({"ok": slot is not None, "why": why}).encode() + b"\n")
        except OSError:
            conn.close()
            return
        if slot is None:
            log.info("tfmagic spark listener: turned away a relay from %s: %s", peer, why)
            conn.close()
            return
        conn.settimeout(None)
        spark_task.keepalive(conn)
        if conn is slot.log_sock:
            threading.Thread(
                target=self._read_log, args=(slot, conn), name="tfmagic-spark-log", daemon=True
            ).start()

    def _claim(self, hello: dict[str, Any], conn: socket.socket) -> tuple[_Slot | None, str]:
        """Give ``conn`` to the slot an authenticated relay serves, or say why it gets none."""
        with self._lock:
            batch = self._batches.get(str(hello.get("batch")))
            if batch is None or batch.closed:
                return None, "no such job (stopped?)"
            index = hello.get("slot")
            if not isinstance(index, int) or not 0 <= index < len(batch.slots):
                return None, f"no slot {index!r} in this job"
            slot = batch.slots[index]
            channel = hello.get("channel")
            if channel == "control":
                if slot.control is not None or slot.done.is_set():
                    return None, f"slot {index} was served already (a retried Spark attempt)"
                slot.relay_pid = hello.get("relay_pid")
                slot.attempt = hello.get("attempt")
                slot.hostname = hello.get("hostname")
                slot.control = conn
                return slot, ""
            if channel == "log":
                if (
                    slot.control is None
                    or slot.log_sock is not None
                    or hello.get("relay_pid") != slot.relay_pid
                ):
                    return None, f"slot {index}'s log connection does not match its control connection"
                slot.log_sock = conn
                return slot, ""
            return None, f"unknown channel {channel!r}"

    def _read_log(self, slot: _Slot, conn: socket.socket) -> None:
        """Frames from a relay: the child's pid, its stderr (into the log file), its exit code."""
        try:
            with open(slot.log_path, "ab") as out:
                while True:
                    try:
                        got = spark_task.read_frame(conn)
                    except OSError:
                        got = None
                    if got is None:
                        break
                    kind, body = got
                    if kind == spark_task.LOG:
                        out.write(body)
                        out.flush()
                    elif kind == spark_task.PID:
                        info = json.loads(body)
                        slot.pid = int(info["pid"])
                        slot.address = info.get("address")
                        slot.hostname = info.get("hostname") or slot.hostname
                        out.write(
                            f"tfmagic: spark: task process {slot.pid} started by a relay (pid "
                            f"{slot.relay_pid}, attempt {slot.attempt}) on {slot.hostname} ({slot.address})\n".encode()
                        )
                        out.flush()
                        slot.started.set()
                    elif kind == spark_task.EXIT:
                        slot.exit_code = json.loads(body).get("code")
                    elif kind == spark_task.ERROR:
                        slot.error = json.loads(body).get("message")
                        out.write(f"tfmagic: spark: {slot.error}\n".encode())
                        out.flush()
        finally:
            slot.done.set()
            slot.started.set()

    # -- jobs ---------------------------------------------------------------------------
    def _config(self, batch: _Batch) -> dict[str, Any]:
        host, port = self._listen()
        env: dict[str, str | None] = dict(TASK_ENV)
        env.update(self.extra_env)
        return {
            "host": host,
            "port": port,
            "secret": self._secret.hex(),
            "batch": batch.id,
            "python": self.python,
            "env": env,
            "guard": self.guard,
            # A checkout that is not installed still works when executors share this machine.
            "pythonpath": PACKAGE_PARENT if self.loopback else None,
        }

    def _submit(self, log_paths: list[str], barrier: bool) -> _Batch:
        ctx = self._context()
        sc = ctx.sc
        n = len(log_paths)
        tasks = ", ".join(Path(p).stem.replace("-", ":", 1) for p in log_paths)
        batch_id = f"{os.getpid()}-{next(_ids)}-{secrets.token_hex(4)}"
        batch = _Batch(
            id=batch_id,
            group=f"tfmagic-{batch_id}",
            description=f"tfmagic: {tasks}" + (" (barrier)" if barrier else " (restart)"),
            barrier=barrier,
        )
        batch.slots = [_Slot(batch, i, p) for i, p in enumerate(log_paths)]
        with self._lock:
            self._batches[batch.id] = batch
        config = self._config(batch)
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(spark_task)
        fn = functools.partial(spark_task.relay_partition, config)
        for slot in batch.slots:
            slot.note(f"submitting to Spark ({self.master}) as part of job group {batch.group}")

        def run() -> None:
            try:
                sc.setJobGroup(batch.group, batch.description, interruptOnCancel=True)
                rdd = sc.parallelize(range(n), n)
                if barrier:
                    rdd = rdd.barrier()
                batch.result = rdd.mapPartitions(fn).collect()
            except BaseException as exc:  # noqa: BLE001 - reported by whoever waits on the batch
                batch.error = exc
            finally:
                batch.finished.set()
                with self._lock:
                    if all(s.done.is_set() or s.control is None for s in batch.slots):
                        self._batches.pop(batch.id, None)

        batch.thread = threading.Thread(target=run, name=f"tfmagic-spark-job-{batch.id}", daemon=True)
        batch.thread.start()
        return batch

    def _wait_started(self, batch: _Batch) -> None:
        """Until every slot's task process runs; a clear error if Spark cannot start them."""
        deadline = time.monotonic() + self.connect_timeout
        while True:
            if all(s.started.is_set() and s.pid is not None for s in batch.slots):
                return
            problem = None
            if batch.error is not None:
                problem = f"Spark could not run the job: {_spark_error_summary(batch.error)}"
            elif batch.finished.is_set():
                errors = [r[2] for r in batch.result or [] if len(r) > 2 and r[2]]
                problem = (
                    "the Spark tasks ended before every relay connected back to "
                    f"{self._config_host()}" + (f": {errors[0]}" if errors else "")
                )
            elif any(s.started.is_set() and s.pid is None for s in batch.slots):
                bad = next(s for s in batch.slots if s.started.is_set() and s.pid is None)
                problem = f"a relay could not start its task: {bad.error or 'it ended'}"
            elif time.monotonic() > deadline:
                waiting = sum(1 for s in batch.slots if not s.started.is_set())
                problem = (
                    f"{waiting} of {len(batch.slots)} Spark tasks had not started within "
                    f"{self.connect_timeout:g} s (not enough free task slots? see the Spark UI at {self.ui_url})"
                )
            if problem is not None:
                self._abandon(batch)
                raise ClusterStartError(
                    f"{problem}. {self._hint(len(batch.slots), problem)}".strip(),
                    log_tail=self._driver_log_tail(),
                )
            time.sleep(0.05)

    def _config_host(self) -> str:
        return f"{self.host}:{self._listener.getsockname()[1] if self._listener else '?'}"

    def _hint(self, n: int, problem: str) -> str:
        if "task slots" in problem:
            return (
                f"A barrier job needs {n} free task slots at once: give the master that many cores "
                f"(local[{n}], or --cores on the workers)."
            )
        if "ended before every relay connected" in problem:
            return (
                "The executors must reach this process at the address above (firewall? "
                "set spark.driver.host to an address they can reach)."
            )
        return ""

    def _driver_log_tail(self) -> str:
        if self._ctx is not None and self._ctx.log_path:
            return read_tail(self._ctx.log_path, 15)
        return ""

    def _abandon(self, batch: _Batch, ctx: _Context | None = None) -> None:
        """Close a batch's connections and cancel its Spark job (its tasks end with both)."""
        ctx = ctx or self._ctx
        with self._lock:
            batch.closed = True
        for slot in batch.slots:
            slot.close()
        if not batch.finished.is_set() and ctx is not None:
            try:
                ctx.sc.cancelJobGroup(batch.group)
            except Exception as exc:  # noqa: BLE001 - the context may be gone already
                log.info("cancelling %s failed: %s", batch.group, exc)
            batch.finished.wait(30)
        with self._lock:
            self._batches.pop(batch.id, None)

    def _process(self, slot: _Slot) -> TaskProcess:
        with self._lock:
            pid = slot.pid
            from .. import owner

            taken = {p.pid for p in owner.processes()} | set(self._by_pid)
            if pid is None or pid in taken:
                pid = next(_fake_pids)  # another host's task with the same pid: a name only
            self._by_pid[pid] = slot
        assert slot.control is not None
        proc = TaskProcess(
            launcher=self,
            pid=pid,
            host=slot.address or "127.0.0.1",
            to_task=slot.control.makefile("wb"),
            from_task=slot.control.makefile("rb"),
            log_path=slot.log_path,
        )
        proc.destination = slot.address
        return proc

    # -- the contract ----------------------------------------------------------------
    def spawn_many(self, log_paths: list[str], hosts: list[str]) -> list[TaskProcess]:
        """One barrier job with a Spark task per log path; returns when every task process runs."""
        if not log_paths:
            return []
        slots = _local_slots(self.master)
        if slots is not None and slots < len(log_paths):
            raise ClusterStartError(
                f"{self.master} has {slots} task slot{'s' if slots != 1 else ''} and a barrier job with "
                f"{len(log_paths)} tasks needs {len(log_paths)} at once: use master='local[{len(log_paths)}]'"
            )
        batch = self._submit(log_paths, barrier=True)
        self._wait_started(batch)
        return [self._process(slot) for slot in batch.slots]

    def spawn(self, log_path: str, host: str | None = None) -> TaskProcess:
        """One task again (a restart): a Spark stage cannot grow, so it is a job of its own.

        The new task must land on ``host`` (the old task's address: the rest
        of the cluster knows it by that address), and Python cannot pin a
        Spark task to a host, so a task placed elsewhere is ended and you are
        told to start the whole cluster again.
        """
        batch = self._submit([log_path], barrier=False)
        self._wait_started(batch)
        slot = batch.slots[0]
        if host and host != "spark" and slot.address and slot.address != host:
            self._abandon(batch)
            raise ClusterStartError(
                f"Spark placed the restarted task on {slot.address}, not on {host} where the rest of the "
                "cluster expects it (a Spark task cannot be pinned to a host from Python); "
                "stop the cluster and start it again"
            )
        return self._process(slot)

    def kill(self, proc: TaskProcess) -> None:
        """Ask the task to end at once (it kills its own group), then end its connection."""
        slot = self._by_pid.get(proc.pid)
        if slot is None or slot.done.is_set():
            return
        proc.send("crash")
        if not slot.done.wait(3):
            # The task did not answer (stopped by a throttle? a stuck relay?): closing the
            # control connection ends its standard input, and with it the task.
            if slot.control is not None:
                try:
                    slot.control.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            if not slot.done.wait(10):
                slot.close()

    def wait_exit(self, proc: TaskProcess) -> int | None:
        slot = self._by_pid.get(proc.pid)
        if slot is None:
            return None
        if not slot.done.wait(15):
            slot.close()
        slot.done.wait(5)
        slot.close()
        with self._lock:
            self._by_pid.pop(proc.pid, None)
            batch = slot.batch
            if batch.finished.is_set() and all(s.done.is_set() for s in batch.slots):
                self._batches.pop(batch.id, None)
        return slot.exit_code

    def diagnose(self, proc: TaskProcess, log_tail: str) -> str:
        slot = self._by_pid.get(proc.pid)
        where = f"{slot.hostname} ({slot.address})" if slot and slot.hostname else "the Spark executors"
        if "No module named 'tfmagic" in log_tail:
            return (
                f"install tfmagic and TensorFlow for {self.python} on every Spark executor host "
                f"({where} here), or pass python= with the Python that has them"
            )
        if "TensorFlow could not be imported" in log_tail or "No module named 'tensorflow" in log_tail:
            return f"install TensorFlow for {self.python} on {where}, or pass python= with the Python that has it"
        if slot is not None and slot.error:
            return slot.error
        return ""

    def close(self) -> None:
        """Cancel this launcher's Spark jobs; stop the Spark application if this launcher made it."""
        with self._lock:
            batches = list(self._batches.values())
            ctx, self._ctx = self._ctx, None
            listener, self._listener = self._listener, None
        for batch in batches:
            if all(s.done.is_set() for s in batch.slots):
                batch.finished.wait(10)  # every task ended: let the job finish as a success
            if not batch.finished.is_set():
                self._abandon(batch, ctx)
        if listener is not None:
            try:  # close() alone does not wake the thread blocked in accept() on Linux
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        if ctx is not None and self._given is None:
            _release_context(ctx)

    def client_address(self, defn) -> str | None:
        """Where the tasks reach this process as a client: ``None`` (TF's ``localhost``) when
        every executor shares this machine, else this machine's address the relays connected
        to, with this process's client port."""
        if self.loopback:
            return None
        if self._client_address is None:
            from .. import client

            local = next(
                (s.control.getsockname()[0] for s in self._by_pid.values() if s.control is not None),
                self._bind_address() or self.host,
            )
            self._client_address = f"{local}:{client.client_port()}"
        return self._client_address

    # -- security ------------------------------------------------------------------------
    def security_note(self) -> str:
        where = "their spec address only" if self.guard else "EVERY network interface"
        return (
            f"tasks run as Spark tasks ({self.master}); their control channel to this process is "
            f"authenticated with a per-cluster secret ({len(self.refused)} strangers refused) but not "
            f"encrypted; task servers listen on {where} and run any TensorFlow graph anyone who can "
            "reach them sends"
        )


def SparkCluster(master: str = "local[3]", ps: int = 1, workers: int = 2, **kwargs):  # noqa: N802 - a constructor
    """A :class:`tfmagic.Cluster` whose tasks run as one Spark barrier job on ``master``.

    Keyword arguments of :class:`SparkLauncher` (``app_name``, ``conf``,
    ``python``, ``spark``, ``guard``, ``connect_timeout``) go to the
    launcher; the rest (``env``, ``start_timeout``, ``name``, ...) to
    :class:`tfmagic.Cluster`.  Stopping the cluster ends
    the Spark job and the Spark application the launcher created.

    >>> with SparkCluster("local[3]", ps=1, workers=2) as cluster:  # doctest: +SKIP
    ...     cluster.connect()
    """
    from ..cluster import Cluster

    names = ("app_name", "conf", "python", "spark", "guard", "connect_timeout")
    launcher_kwargs = {k: kwargs.pop(k) for k in names if k in kwargs}
    launcher = SparkLauncher(master, **launcher_kwargs)
    return Cluster(ps, workers, launcher=launcher, spares=False, **kwargs)
