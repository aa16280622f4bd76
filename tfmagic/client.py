"""This process as a client of a cluster (the notebook kernel, or a script).

``experimental_connect_to_cluster`` is process-wide state in TensorFlow, so it
lives here, in one place: which cluster we are connected to, and renewing the
connection when a task was restarted (a restarted task answers ``Unable to
find a context_id`` until the client connects again).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Iterator

from .errors import TfmagicError
from .spec import ClusterDef, TaskName

_lock = threading.RLock()


class ClientPortTaken(TfmagicError):
    """The client port a tunnel forwards to is held by an older TensorFlow client server."""


class _Gate:
    """Many remote calls at once, or one (re)connection, never both.

    TensorFlow's connect waits for every op in flight; a training engine
    whose threads are mid-call would otherwise race a reconnection after a
    task restart.  Engines wrap each remote call in ``gate.call()``.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls = 0
        self._exclusive = False

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._calls += 1
        try:
            yield
        finally:
            with self._cond:
                self._calls -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._exclusive = True
            while self._calls:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


gate = _Gate()
_connected: tuple[int, tuple] | None = None  # (cluster id, frozen spec)
_generation = 0


#: A client address a launcher asked for -> the one TensorFlow serves on.
_served: dict[str, str] = {}


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _serving_address(requested: str, same_def: bool, fixed_port: bool = False) -> str:
    """Where this process will serve as the client for ``requested``.

    TensorFlow starts a new gRPC server whenever the cluster definition
    changes and never shuts the old ones down (measured here: connecting
    to an SSH cluster, then a local one, then the SSH one again failed with
    "Could not start gRPC server": the first server still held the port the
    launcher asks for each time).  An unchanged definition (a reconnection
    after a task restart) keeps TF's server, so it keeps its address; a
    changed one gets a free port on the same host when the asked one is
    taken.
    """
    actual = _served.get(requested, requested)
    if same_def:
        return actual
    host, _, port = actual.rpartition(":")
    if _port_free(host, int(port)):
        return actual
    if fixed_port:
        raise ClientPortTaken(
            f"this process already served as another cluster's client on port {port} (TensorFlow keeps "
            "its client servers until the process ends), and this cluster's SSH tunnels lead to that port. "
            "Stop this cluster and start it again (%tf_cluster stop, then start): it picks a new port."
        )
    from .launchers.local import free_port

    fresh = f"{host}:{free_port(host)}"
    _served[requested] = fresh
    return fresh


def _frozen(defn: ClusterDef) -> tuple:
    return tuple((job, tuple(addrs)) for job, addrs in defn.jobs.items())


def resolver(defn: ClusterDef):
    """A cluster resolver that ``ParameterServerStrategy`` accepts as is.

    ``rpc_layer="grpc"`` matters: without it remote devices silently do not
    appear after connecting.
    """
    import tensorflow as tf

    return tf.distribute.cluster_resolver.SimpleClusterResolver(defn.to_tf(), rpc_layer="grpc")


_previous_hook = None


def _quiet_stale_handles(unraisable) -> None:
    """Keep "Exception ignored in EagerResourceDeleter.__del__" out of sight.

    When a cluster is stopped or replaced, Python later garbage-collects the
    old remote variables and TensorFlow fails to delete them on servers that
    are gone.  That is expected, not the user's problem: it goes to the
    kernel's log (``%tf_cluster logs kernel``) instead of the notebook.
    """
    try:
        where = str(getattr(unraisable.object, "__qualname__", "") or "")
        exc = unraisable.exc_value
        stale = "EagerResourceDeleter" in where and str(type(exc).__module__).startswith("tensorflow")
    except Exception:  # noqa: BLE001 - at interpreter exit half the world is gone
        stale = False
    if not stale:
        (_previous_hook or sys.__unraisablehook__)(unraisable)
        return
    try:
        from . import owner

        first = (str(exc).splitlines() or [""])[0]
        with open(owner.runtime_dir() / "kernel-native.log", "a") as log:
            log.write(f"ignored while deleting a stale remote resource: {type(exc).__name__}: {first}\n")
    except Exception:  # noqa: BLE001 - logging this is a courtesy
        pass


def _install_quiet_hook() -> None:
    global _previous_hook
    if sys.unraisablehook is not _quiet_stale_handles:
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _quiet_stale_handles


def connect(
    owner_id: int,
    defn: ClusterDef,
    *,
    force: bool = False,
    client_address: str | None = None,
    fixed_port: bool = False,
) -> bool:
    """Make this process a client of the cluster; returns whether it (re)connected.

    Connecting again to the same cluster is a no-op unless ``force`` (used
    after a task restart).  The client joins as job ``localhost``, outside the
    cluster's own spec, and keeps its own CPU as the default device.

    ``client_address`` is where the tasks reach this process (they pull
    tensors the client made from it).  TensorFlow's default,
    ``localhost:<port>``, only works when every task shares this machine's
    loopback; remote launchers give an address the tasks can reach.
    """
    global _connected, _generation
    key = (owner_id, _frozen(defn), client_address)
    with _lock:
        if _connected == key and not force:
            return False
        import os

        import tensorflow as tf

        _install_quiet_hook()
        # A call to a dead task should fail at once (the engine then knows the
        # task is lost), not wait for it to come back.
        os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
        target = resolver(defn)
        if client_address:
            address = _serving_address(client_address, same_def=_connected == key, fixed_port=fixed_port)
            jobs = {**defn.as_dict(), "localhost": [address]}
            target = tf.distribute.cluster_resolver.SimpleClusterResolver(
                tf.train.ClusterSpec(jobs), rpc_layer="grpc"
            )
        with gate.exclusive():
            tf.config.experimental_connect_to_cluster(
                target, job_name="localhost", make_master_device_default=False
            )
        _connected = key
        _generation += 1
        return True


def is_connected(owner_id: int) -> bool:
    return _connected is not None and _connected[0] == owner_id


def forget(owner_id: int) -> None:
    """Note that the cluster ``owner_id`` is gone (its servers were stopped)."""
    global _connected
    with _lock:
        if _connected is not None and _connected[0] == owner_id:
            _connected = None


def generation() -> int:
    """Increases each time the connection is (re)made; remote handles from an
    older generation are no longer valid."""
    return _generation


@contextlib.contextmanager
def on_task(task: TaskName) -> Iterator[str]:
    """Place the ops created inside on ``task`` (TF's ``tf.device``)."""
    import tensorflow as tf

    with tf.device(task.device):
        yield task.device
