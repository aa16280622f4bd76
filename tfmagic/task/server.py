"""A task's TensorFlow server: the server core imported without the rest of the API, and its role.

A task imports what a ``tf.distribute.Server`` needs at once (the server
core: 0.6 s and 0.37 GB here, against 4 s and 0.7 GB for all of ``import
tensorflow``; see :class:`ServerCore`), then waits, *warm*, for a role.
:func:`serve` starts the server of that role (on the relay's private port
with a modelled network, or as ``MultiWorkerMirroredStrategy``'s own server
in collective mode).  A ``%%tf_px`` cell sees it as ``server``
(:class:`ServerInCell`), whose ``join()`` returns.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from typing import Any


def tune_monitored_session(tf) -> None:
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


def quiet_queue_runner_shutdown(args) -> None:
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
                    f"tfmagic: completed TensorFlow's Python API in {time.monotonic() - t0:.1f} s",
                    file=sys.__stderr__,  # the log, never a running cell (fd 1 may reach one: fdout)
                    flush=True,
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


def serve(core: ServerCore, tf, msg: dict[str, Any], cpu_only: bool):
    """Start the server of the role ``msg`` gives (an ``assign``); returns ``(server, strategy or None)``.

    ``tf`` is asked for only in collective mode (it needs the whole API).
    Collective mode: ``MultiWorkerMirroredStrategy`` starts this task's server
    itself (TF's all-reduce strategy enables collective ops, which starts a
    gRPC server on the task's port inside the eager context; a pre-started
    ``tf.distribute.Server`` on that port would make it fail), and cells find
    it as ``strategy``.
    """
    job, index, cluster = msg["job"], int(msg["index"]), msg["cluster"]
    threads = msg.get("threads") or {}
    config = core.config_pb2.ConfigProto(
        intra_op_parallelism_threads=int(threads.get("intra", 0)),
        inter_op_parallelism_threads=int(threads.get("inter", 0)),
    )
    if cpu_only:
        config.device_count["GPU"] = 0
    if msg.get("collective"):
        strategy = tf().distribute.MultiWorkerMirroredStrategy()
        return CollectiveServer(f"grpc://{cluster[job][index]}"), strategy
    spec = core.server_lib.ClusterSpec(cluster)
    if msg.get("bind_port"):
        # A modelled network: the cluster's address for this task is the
        # relay's (tfmagic.network.shaper); the server itself listens here.
        from tensorflow.core.protobuf import tensorflow_server_pb2

        server_def = tensorflow_server_pb2.ServerDef(
            cluster=spec.as_cluster_def(),
            job_name=job,
            task_index=index,
            protocol="grpc",
            default_session_config=config,
            port=int(msg["bind_port"]),
        )
        return core.server_lib.Server(server_def, start=True), None
    server = core.server_lib.Server(
        spec, job_name=job, task_index=index, protocol="grpc", config=config, start=True
    )
    return server, None


def cut_off(port: int) -> int:
    """Cut every TCP socket of this process on local ``port``: a server's death, modelled.

    TensorFlow cannot stop a ``tf.distribute.Server`` (``GrpcServer::Stop`` is not implemented), and
    a task sharing its process (``processes=``) cannot be killed without killing the others. Its
    server's sockets can be shut down under gRPC, though: the listening socket stops listening (a
    client's connect is refused, as a dead process's port refuses it) and every accepted connection
    ends (calls in flight fail with "Socket closed"), which is what the other tasks and the client
    see when a machine dies. gRPC keeps its descriptors and closes them itself (``shutdown``, not
    ``close``: no descriptor is pulled from under it), and the port is free for a new server.
    Measured here: no CPU spent afterwards, a new server on the port 0.08 s later. The dead
    server's own outgoing connections (a worker's to the ps) cannot be told apart from the other
    servers' in the process and stay open; nothing sends on them, as nobody reaches the dead server.
    Returns how many sockets were cut.
    """
    import socket

    cut = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(fd))  # a copy: closing it leaves gRPC's descriptor
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
        try:
            if (
                sock.family in (socket.AF_INET, socket.AF_INET6)
                and sock.type == socket.SOCK_STREAM
                and sock.getsockname()[1] == port
            ):
                sock.shutdown(socket.SHUT_RDWR)
                cut += 1
        except OSError:
            pass  # already shut, or never connected
        finally:
            sock.close()
    return cut


class ServerInCell:
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


class CollectiveServer:
    """What ``server`` is in collective mode: the target of the task's in-process server."""

    def __init__(self, target: str) -> None:
        self.target = target

    def join(self) -> None:
        threading.Event().wait()

    def __repr__(self) -> str:
        return f"<collective-mode server {self.target}>"


__all__ = [
    "cut_off",
    "CollectiveServer",
    "ServerCore",
    "ServerInCell",
    "quiet_queue_runner_shutdown",
    "serve",
    "tune_monitored_session",
]
