"""This process as a client of a cluster (the notebook kernel, or a script).

TensorFlow's connection to a cluster (its eager context's server definition)
is process-wide state, so it lives here, in one place: which cluster we are
connected to, moving to another one without a new client server each time
(:func:`client_port`), renewing the connection when a task was restarted (a
restarted task answers ``Unable to find a context_id`` until the client
connects again), and never letting a task that does not answer take the
kernel with it (:class:`_Gate`, the deadline in :func:`connect`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator

from .doctor import waits
from .errors import ClientBusy
from .network import clientserver
from .spec import ClusterDef, TaskName

_lock = threading.RLock()


#: Seconds a change of the connection waits for remote calls in flight, and for TensorFlow.
CONNECT_TIMEOUT = 10.0
#: Seconds a new connection waits for an earlier change still under way before it says so.
PENDING_GRACE = 5.0


class _Gate:
    """Many remote calls at once, or one change of the connection, never both.

    TensorFlow's connect waits for every op in flight, and an op on a task
    that does not answer (stopped, hung) waits for ever; so a change of the
    connection (a task restarted, another cluster) first waits for the calls
    in flight, *with a deadline*, and says who holds it instead of hanging.
    A training run that gives up on its calls (``stop()`` while a task does
    not answer) drops them with :meth:`drop`: nothing later inherits them.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls: dict[object, tuple[str, float]] = {}  # token -> (who, since)
        self._exclusive = False

    @contextlib.contextmanager
    def call(self, who: str = "a remote call", on: Iterable[str] = (), detail: str = "") -> Iterator[None]:
        """Make remote calls inside (``on``: the tasks they wait on, for the hang doctor)."""
        token = object()
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._calls[token] = (who, time.monotonic())
        wait = waits.begin(who, on, detail) if on else None
        try:
            yield
        finally:
            if wait is not None:
                waits.end(wait)
            with self._cond:
                self._calls.pop(token, None)
                self._cond.notify_all()

    def drop(self, who: str) -> int:
        """Forget the calls ``who`` left waiting (they may never return); how many there were."""
        with self._cond:
            tokens = [t for t, (w, _since) in self._calls.items() if w == who]
            for t in tokens:
                del self._calls[t]
            self._cond.notify_all()
        return len(tokens)

    def in_flight(self) -> list[tuple[str, float]]:
        """``(who, seconds waiting)`` of every call in flight, oldest first."""
        now = time.monotonic()
        with self._cond:
            return sorted(((w, now - t0) for w, t0 in self._calls.values()), key=lambda x: -x[1])

    @contextlib.contextmanager
    def exclusive(self, timeout: float = CONNECT_TIMEOUT) -> Iterator[None]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._exclusive:  # one change at a time
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClientBusy("another change of the connection is under way; try again")
                self._cond.wait(min(left, 0.25))
            self._exclusive = True  # from here no new call starts: the ones in flight drain
            try:
                while self._calls:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        who, waited = self.in_flight()[0]
                        raise ClientBusy(
                            f"the connection to the cluster cannot change now: {who} has waited {waited:.0f} s "
                            "for a task that does not answer; stop that run or cell, or restart (or stop) the "
                            "task it waits on, then try again"
                        )
                    self._cond.wait(min(left, 0.25))
            except BaseException:
                self._exclusive = False
                self._cond.notify_all()
                raise
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


gate = _Gate()
#: Held while TensorFlow changes this process's connection (with the check of which tasks answer
#: just before it), and by whoever ends a task (:func:`steady_connection`).
_changing = threading.Lock()


@contextlib.contextmanager
def steady_connection(timeout: float = CONNECT_TIMEOUT + 5) -> Iterator[None]:
    """End tasks inside this: no change of the connection is under way meanwhile.

    TensorFlow's change of the connection waits for every task in its definition holding Python's
    global lock, so a task ended while a change was under way froze this whole process: a
    ``restart ps:0 --force`` just after a run began connecting killed the ps, and the restart could
    not bring it back (no thread ran; the soak's seed 10, for 120 s and more). A change that starts
    afterwards checks which tasks answer and leaves the dead one out. A change that does not end in
    ``timeout`` (it waits on a task already dead) is not waited for longer.
    """
    held = _changing.acquire(timeout=timeout)
    try:
        yield
    finally:
        if held:
            _changing.release()


_connected: tuple | None = None  # (cluster id, frozen spec, client address)
_generation = 0
_port: int | None = None
_pending: threading.Thread | None = None  # a change of the connection that did not finish in time
_omitted: list = []  # tasks left out of the connection: they did not answer when it was made


def client_port() -> int:
    """The port this process serves on as every cluster's client, chosen once.

    TensorFlow starts a gRPC server in the client the first time it connects
    (kept on loopback by :mod:`tfmagic.network.clientserver`) and never stops it.  Moving to another cluster with a *new* server definition made
    it start one more each time (measured: +89 threads, +40 MB and one more
    open port per cluster); tfmagic keeps the client's own task and port the
    same and moves with ``update_server_def`` instead (+3 threads, no port).
    """
    global _port
    with _lock:
        if _port is None:
            from .network.ports import free_port

            _port = free_port("0.0.0.0")
        return _port


def server_note() -> str:
    """Where this process's own TensorFlow server listens (measured once it is up), in one clause."""
    return clientserver.describe(_port)


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
        from .procs import owner

        first = (str(exc).splitlines() or [""])[0]
        with open(owner.kernel_log(), "a") as log:
            log.write(f"ignored while deleting a stale remote resource: {type(exc).__name__}: {first}\n")
    except Exception:  # noqa: BLE001 - logging this is a courtesy
        pass


def _install_quiet_hook() -> None:
    global _previous_hook
    if sys.unraisablehook is not _quiet_stale_handles:
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _quiet_stale_handles


def connect(
    owner_id: int, defn: ClusterDef, *, force: bool = False, client_address: str | None = None
) -> bool:
    """Make this process a client of the cluster; returns whether it (re)connected.

    Connecting again to the same cluster is a no-op unless ``force`` (used
    after a task restart).  The client joins as job ``localhost``, outside
    the cluster's own spec, always as the same task on the same port (see
    :func:`client_port`), and keeps its own CPU as the default device.

    ``client_address`` is where the tasks reach this process (they pull
    tensors the client made from it).  TensorFlow's default,
    ``localhost:<port>``, only works when every task shares this machine's
    loopback; remote launchers give an address the tasks can reach.

    Tasks that do not answer now (dead, stopped) are left out of the
    connection (:func:`omitted` lists them): TensorFlow's connect waits for
    every task in the definition for ever, *holding Python's global lock*
    (measured: one task whose port refused connections froze the whole
    process, interrupts included).  Ops placed on a left-out task fail at
    once ("unknown device"); connecting again (``force``, a restart) takes
    it back when it answers.  The change itself runs on a helper thread with
    a deadline, for what slips past that check.
    """
    global _connected, _generation, _pending
    key = (owner_id, _frozen(defn), client_address)
    with _lock:
        if _connected == key and not force:
            return False
        if _pending is not None:
            # a change left waiting on a dead task ends once that task answers again (a restart): about
            # a second after it, measured; a new connection right after the restart waits that out
            _pending.join(PENDING_GRACE)
        if _pending is not None and _pending.is_alive():
            raise ClientBusy(
                "an earlier connection to a cluster is still waiting for a task that does not answer; "
                "stop that cluster (%tf_cluster stop) or end the task it waits on, then try again"
            )
        _pending = None
        import tensorflow as tf
        from tensorflow.core.protobuf.tensorflow_server_pb2 import ServerDef
        from tensorflow.python.eager import context

        _install_quiet_hook()
        # A call to a dead task should fail at once (the engine then knows the
        # task is lost), not wait for it to come back.
        os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
        # The kernel shares the machine's GPUs with a local cluster's workers:
        # TensorFlow's default would take nearly all of a card's memory here first.
        os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
        address = client_address or f"localhost:{client_port()}"
        ctx = context.context()
        first = ctx.get_server_def() is None
        if first:
            clientserver.keep_local()
            clientserver.serve_lightly()
            clientserver.give_up_on_silent_peers()
        host, port = address.rsplit(":", 1)
        peers = (
            set()
            if clientserver.is_loopback(host)
            else clientserver.peers_of([defn.address(t) for t in defn.tasks()])
        )
        clientserver.open_door(host, int(port), peers)  # and close the door of the cluster before
        outcome: list = []
        left_out: list[TaskName] = []

        def change() -> None:
            try:
                with _changing:  # no task is ended from here until TensorFlow is done (steady_connection)
                    jobs, gone = _answering(defn)
                    left_out.extend(gone)
                    jobs["localhost"] = {0: address}
                    server_def = ServerDef(
                        cluster=tf.train.ClusterSpec(jobs).as_cluster_def(),
                        job_name="localhost",
                        task_index=0,
                        protocol="grpc",
                        default_session_config=ctx.config,
                    )
                    _change(ctx, server_def, first)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
                outcome.append(exc)

        with gate.exclusive():
            worker = threading.Thread(target=change, name="tfmagic-connect", daemon=True)
            worker.start()
            try:
                worker.join(CONNECT_TIMEOUT)
            finally:  # also when interrupted: the change may still be under way in TensorFlow
                if worker.is_alive():
                    _pending = worker
                    _connected = None
            if worker.is_alive():
                raise ClientBusy(
                    f"connecting to the cluster did not finish in {CONNECT_TIMEOUT:g} s: a task accepts "
                    "connections but does not answer (stopped with SIGSTOP, hung, or not a TensorFlow "
                    "server); cluster.why() says which. Stop that cluster or end that task, then try again"
                )
        if outcome and outcome[0] is not None:
            _connected = None
            raise outcome[0]
        _connected = key
        _omitted[:] = left_out
        _generation += 1
        return True


def _change(ctx, server_def, first: bool) -> None:
    """TensorFlow's change of this process's connection to ``server_def``.

    The first is to a definition of this process alone, then the cluster comes by an update: TensorFlow's
    Python binding of its first change (``TFE_ContextSetServerDef``) holds the global lock while it
    waits for every task, so a task that died between :func:`_answering`'s check and that change froze
    the whole process for ever, the deadline's thread included (reproduced: 3 of 3, ps or worker);
    its update (``TFE_ContextUpdateServerDef``) releases the lock, and the deadline holds.
    """
    if first:
        alone = type(server_def)()
        alone.CopyFrom(server_def)
        del alone.cluster.job[:]
        alone.cluster.job.extend(j for j in server_def.cluster.job if j.name == server_def.job_name)
        ctx.set_server_def(alone)
        # Before any op ran here, the server def is only kept: the first op would
        # connect, waiting for ever (the global lock held) on a task killed meanwhile
        # (a kill between %tf_cluster start and the first run hung it). Connect now,
        # on this thread with its deadline.
        ctx.ensure_initialized()
    ctx.update_server_def(server_def)


def _answering(defn: ClusterDef) -> tuple[dict[str, dict[int, str]], list[TaskName]]:
    """The definition's tasks that answer as gRPC servers now, and those left out."""
    from concurrent.futures import ThreadPoolExecutor

    from .network.ports import grpc_answers

    tasks = defn.tasks()
    with ThreadPoolExecutor(max_workers=min(16, len(tasks) or 1)) as pool:
        answers = list(pool.map(lambda t: grpc_answers(defn.address(t), timeout=1.5), tasks))
    jobs: dict[str, dict[int, str]] = {}
    left_out = []
    for task, ok in zip(tasks, answers, strict=True):
        if ok:
            jobs.setdefault(task.job, {})[task.index] = defn.address(task)
        else:
            left_out.append(task)
    return jobs, left_out


def omitted() -> list[TaskName]:
    """Tasks of the connected cluster that did not answer when it was (re)connected (left out of it)."""
    return list(_omitted)


def is_connected(owner_id: int) -> bool:
    return _connected is not None and _connected[0] == owner_id


def forget(owner_id: int) -> None:
    """Note that the cluster ``owner_id`` is gone (its servers were stopped)."""
    global _connected
    with _lock:
        if _connected is not None and _connected[0] == owner_id:
            _connected = None
            clientserver.close_doors()  # its tasks no longer need to reach this process


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
