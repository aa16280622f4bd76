"""The Spark application the tasks run in: Spark's JVM, started here, and the shared SparkContext.

A process holds at most one SparkContext, so every Spark launcher of this
process shares it: :func:`acquire` returns tfmagic's context (or the user's
active one), counting its users, and :func:`release` stops a context
tfmagic created (and its JVM) when its last user lets go.

Why tfmagic starts the JVM itself (:func:`launch_jvm`): this process (the
notebook kernel) may have imported TensorFlow, and pyspark's own launcher
runs Python code in the forked child (``preexec_fn``), which is not safe
after TensorFlow; it also sends the JVM's chatter to the kernel's stderr.
Here the JVM is a plain spawn in its own session (a notebook interrupt does
not reach it) with its output in a log file; it ends itself when its
standard input (held here) closes.

pyspark is imported only when a context is needed: ``import tfmagic`` and
``import tfmagic.launchers.spark`` never import it.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any

from ...errors import ClusterStartError
from ...logs import read_tail

log = logging.getLogger("tfmagic.spark")

INSTALL_HINT = "pip install 'tfmagic[spark]'"

#: Settings every context tfmagic creates gets (``conf=`` overrides them).
DEFAULT_CONF = {
    # A fresh Python worker per Spark task: nothing of a task outlives it.
    "spark.python.worker.reuse": "false",
    # Without these a barrier stage waits 15 s per check for executors.
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.ui.showConsoleProgress": "false",
}

#: What to write instead of a master Spark cannot use.
MASTER_FORMS = "local[N], spark://HOST:PORT, yarn or k8s://URL"

_log_ids = itertools.count(1)


# -- masters -----------------------------------------------------------------------


def is_loopback_master(master: str) -> bool:
    """Whether every executor of ``master`` runs on this machine's loopback."""
    if master.startswith("local"):
        return True
    if master.startswith("spark://"):
        hosts = master[len("spark://") :].split(",")
        return all(h.rsplit(":", 1)[0] in ("127.0.0.1", "localhost", "[::1]") for h in hosts)
    return False


def local_slots(master: str) -> int | None:
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


def check_master_reachable(master: str, timeout: float = 5.0) -> None:
    """A ``spark://`` master nobody answers at fails here, in one line, before a JVM starts.

    (Spark itself would start the application and retry registering with the
    master for a minute, then fail with a page of Java frames.)  Other kinds
    of master are left to Spark.
    """
    if not master.startswith("spark://"):
        return
    problems = []
    for hostport in master[len("spark://") :].split(","):
        host, _, port = hostport.rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit():
            problems.append(f"{hostport!r} is not HOST:PORT")
            continue
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
            return  # one master of a high-availability list answers: Spark finds the leader
        except socket.gaierror:
            problems.append(f"there is no host {host!r}")
        except OSError as exc:
            problems.append(f"nothing answers at {host}:{port} ({exc.strerror or type(exc).__name__})")
    raise ClusterStartError(
        f"cannot reach the Spark master {master}: {'; '.join(problems)}. "
        "Check that the master is running and that the URL is right (spark://HOST:PORT, port 7077 by default)"
    )


def error_summary(exc: BaseException) -> str:
    """The line of a (long, Java) Spark error that says what went wrong."""
    text = str(exc)
    if "SPARK-24819" in text or "BarrierJobSlotsNumberCheckFailed" in text:
        return "the Spark cluster has fewer free task slots (cores) than this job has tasks"
    for line in text.splitlines():
        line = line.strip().lstrip(": ")
        if line and not line.startswith(("at ", "Traceback", "File ")):
            return line[:500]
    return type(exc).__name__


def _jvm_failure(log_path: str) -> str:
    """What a JVM that did not start said: its exception's message, without the frames."""
    for line in reversed(read_tail(log_path, 200).splitlines()):
        if "Exception" in line and not line.lstrip().startswith("at "):
            message = line.split("Exception: ", 1)[-1] if "Exception: " in line else line
            return message.strip()[:300]
    return ""


# -- pyspark and Java ---------------------------------------------------------------


def import_pyspark():
    try:
        import pyspark
    except ImportError:
        raise ClusterStartError(
            f"the Spark backend needs pyspark, which is not installed here: {INSTALL_HINT}"
        ) from None
    return pyspark


def check_java() -> None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return
    if shutil.which("java") is None:
        raise ClusterStartError(
            "Spark needs Java (17 or newer for Spark 4) and there is no `java` here: "
            "apt-get install default-jre-headless (or set JAVA_HOME)"
        )


# -- the JVM --------------------------------------------------------------------------


def launch_jvm(
    master: str, conf_pairs: list[tuple[str, str]], env: dict[str, str], log_path: str, timeout: float = 120.0
):
    """Start Spark's JVM ourselves and return ``(py4j gateway, Popen)``.

    The same start as pyspark's ``launch_gateway`` without its ``preexec_fn``
    (see the module docstring): ``spark-submit pyspark-shell`` in its own
    session, with its output in ``log_path``.
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
                said = _jvm_failure(log_path)
                if said and "master" in said.lower():
                    raise ClusterStartError(
                        f"Spark cannot use the master {master!r}: {said}; use {MASTER_FORMS}",
                        log_tail=read_tail(log_path, 15),
                    )
                raise ClusterStartError(
                    f"Spark's JVM did not start (exit code {proc.returncode})"
                    + (f": {said}" if said else ""),
                    log_tail=read_tail(log_path, 15),
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
        end_jvm(proc)
        raise
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    gateway.proc = proc
    return gateway, proc


def end_jvm(proc: subprocess.Popen, timeout: float = 15.0) -> None:
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


# -- the shared context ----------------------------------------------------------------


class SharedContext:
    """A SparkContext and whether (and by how many launchers) tfmagic holds it."""

    def __init__(self, sc: Any, owned: bool, jvm: subprocess.Popen | None, log_path: str | None) -> None:
        self.sc = sc
        self.owned = owned
        #: Spark's JVM when tfmagic started it (``None``: the user's, or pyspark's own start)
        self.jvm = jvm
        #: the JVM's output (the driver log)
        self.log_path = log_path
        self.users = 0


_lock = threading.Lock()
_shared: SharedContext | None = None


def acquire(master: str, app_name: str, conf: dict[str, str], loopback: bool) -> SharedContext:
    """The context for ``master``: tfmagic's shared one, the user's active one, or a new one."""
    global _shared
    import_pyspark()
    from pyspark import SparkConf, SparkContext

    with _lock:
        active = SparkContext._active_spark_context
        if _shared is not None and active is _shared.sc:
            ctx = _shared
        elif active is not None:
            ctx = SharedContext(active, owned=False, jvm=None, log_path=None)
        else:
            ctx = _shared = _create(master, app_name, conf, loopback, SparkConf, SparkContext)
        if ctx.sc.master != master:
            raise ClusterStartError(
                f"this process already runs a SparkContext for {ctx.sc.master}, and a process can hold "
                f"only one; use master={ctx.sc.master!r}, or stop that context first"
            )
        ctx.users += 1
        return ctx


def _create(master: str, app_name: str, conf: dict[str, str], loopback: bool, SparkConf, SparkContext):  # noqa: N803 - classes
    check_java()
    check_master_reachable(master)
    pairs = {"spark.master": master, "spark.app.name": app_name, **DEFAULT_CONF}
    env = {}
    if loopback:
        # The driver's RPC, block manager and UI on loopback only.
        pairs.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
    pairs.update(conf)
    from ...procs import owner

    log_path = str(owner.runtime_dir() / f"spark-driver-{next(_log_ids)}.log")
    spark_conf = SparkConf(loadDefaults=False)
    for key, value in pairs.items():
        spark_conf.set(key, value)
    jvm = None
    if SparkContext._gateway is None:
        try:
            SparkContext._gateway, jvm = launch_jvm(master, sorted(pairs.items()), env, log_path)
            SparkContext._jvm = SparkContext._gateway.jvm
        except (ImportError, AttributeError) as exc:  # another pyspark's internals
            log.warning("starting Spark's JVM the pyspark way (%s)", exc)
    try:
        sc = SparkContext(conf=spark_conf)
    except BaseException as exc:
        if jvm is not None:
            SparkContext._gateway = SparkContext._jvm = None
            end_jvm(jvm)
        if isinstance(exc, Exception) and not isinstance(exc, ClusterStartError):
            raise ClusterStartError(
                f"Spark could not start an application on {master}: {error_summary(exc)}",
                log_tail=read_tail(log_path, 15),
            ) from exc
        raise
    sc.setLogLevel("WARN")
    return SharedContext(sc, owned=True, jvm=jvm, log_path=log_path)


def release(ctx: SharedContext) -> None:
    """One user fewer; the last one stops a context tfmagic created (and its JVM)."""
    global _shared
    with _lock:
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
            end_jvm(ctx.jvm)


class Application:
    """One launcher's hold on a SparkContext: the one it was given, or the shared one.

    ``current`` is ``None`` until :meth:`get` (the first job) and again after
    :meth:`release`.
    """

    def __init__(self, master: str, app_name: str, conf: dict[str, str], loopback: bool, given: Any = None):
        self.master = master
        self.app_name = app_name
        self.conf = conf
        self.loopback = loopback
        self.given = given
        self.current: SharedContext | None = None
        self._lock = threading.Lock()

    def get(self) -> SharedContext:
        with self._lock:
            if self.current is None:
                if self.given is not None:
                    self.current = SharedContext(self.given, owned=False, jvm=None, log_path=None)
                    self.current.users = 1
                else:
                    self.current = acquire(self.master, self.app_name, self.conf, self.loopback)
            return self.current

    def detach(self) -> SharedContext | None:
        """Stop using the context (returned, for whoever still has jobs to cancel in it)."""
        with self._lock:
            ctx, self.current = self.current, None
            return ctx

    def let_go(self, ctx: SharedContext | None) -> None:
        """Release a context :meth:`detach` returned (a given one is left running)."""
        if ctx is not None and self.given is None:
            release(ctx)

    @property
    def ui_url(self) -> str | None:
        return self.current.sc.uiWebUrl if self.current is not None else None

    @property
    def driver_host(self) -> str | None:
        if self.current is None:
            return None
        return self.current.sc.getConf().get("spark.driver.host")

    def driver_log_tail(self, lines: int = 15) -> str:
        ctx = self.current
        return read_tail(ctx.log_path, lines) if ctx is not None and ctx.log_path else ""
