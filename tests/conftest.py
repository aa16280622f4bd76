"""Shared fixtures: one real cluster per session, and a process-leak check.

TensorFlow processes cost ~5 s and ~0.35 GB each here, so tests share a
session-scoped cluster wherever they can; tests that must start their own
processes are checked afterwards for anything left behind.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable

import psutil
import pytest

import tfmagic

#: the repository's root (test-artifacts/ lives there)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Spares are tested on purpose where they matter; elsewhere they would only
# add background imports to every test's CPU load.
os.environ.setdefault("TFMAGIC_SPARES", "0")


#: The tiers, fastest first; every test carries at least one (``unit`` alone, or the kinds of real
#: process it starts). ``tests/README.md`` gives each tier's time budget.
TIERS = ("unit", "cluster", "kernel", "notebook", "browser", "soak", "server")


#: The timed lane: tests whose figures need the machine's time (paced clusters, lessons that check
#: what they print, experiments, soaks). The other lane runs beside it at a lower CPU priority
#: (:data:`REST_NICE`), so the timed lane sees an almost quiet machine and the rest fills the idle
#: core. On two cores the suite used 0.85 cores on average in one lane (tests/durations.py).
TIMED_FILES = {
    "test_notebooks.py",
    "test_notebook05.py",
    "test_experiments.py",
    "test_soak.py",
    "test_fault_soak.py",
    "test_training.py",
    "test_dashboard.py",
    # between-graph programs: each worker's share of the steps is what they check
    "test_px.py",
    # the relay's delays and rates, measured against the model: at niceness 19 beside a lesson the
    # relay (the test's child) was starved, a 40 ms delay measured 281 ms (two clean-clone runs)
    "test_netlinks.py",
    # not timed, but its JVM and Spark tasks fit here without disturbing a lesson (this lane runs
    # one test at a time): the two lanes took about 1,100 s each in a full run
    "test_spark.py",
    # not timed: a real JupyterHub, two students' kernels and their class experiment (about 110 s);
    # here once the Binder environment's uv install left this lane about 200 s shorter than the rest
    "test_hub.py",
}
#: (test_binder_env.py, building Binder's environment with uv, about 65 s, came here from the timed lane
#: when that lane grew to 1,873 s of tests against the rest's 1,277 (run j, session 23) and the
#: ps-scaling experiment added about 105 s to it.)
#: (test_slurm.py, a private Slurm's daemons and jobs, runs in the rest lane: in the timed lane beside
#: Spark it made that lane 1,564 s against the rest's 1,277 in a clean-clone run.)
#: the niceness of the other lane's worker and everything it starts (kernels, tasks, servers).
#: Three lanes (two niced) were tried on 2026-12-02 and gave nothing: 1,507 s against 1,545 on the
#: same machine, the same CPU, and the niced lanes' timed checks (a shaped link's rate, a Spark JVM's
#: start) starved (tests/README.md)
REST_NICE = 19


def lane(item) -> str:
    """``timed`` or ``rest``: the xdist group (``--dist loadgroup``) the test runs in."""
    return "timed" if item.path.name in TIMED_FILES else "rest"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    """Run the fast tier first, refuse a test that names no tier, and give each test its lane.

    Unit tests move to the front (each tier keeps its order, so a module's shared fixtures stay
    together); when one of them fails, the run stops once the unit tier has finished
    (:func:`pytest_runtest_makereport`), so CI reports a broken contract within about two minutes
    instead of after the notebooks. Under pytest-xdist (``-n 2``, the default in pyproject.toml)
    every test joins one of two groups, so each lane runs on one worker in this order.
    """
    unmarked = [item.nodeid for item in items if not any(item.get_closest_marker(t) for t in TIERS)]
    if unmarked:
        raise pytest.UsageError(
            f"{len(unmarked)} test(s) carry no tier marker ({', '.join(TIERS)}), first {unmarked[0]}: "
            "mark each with the tier of what it starts"
        )
    unit = [item for item in items if _is_unit(item)]
    items[:] = unit + [item for item in items if not _is_unit(item)]
    for item in items:
        item.add_marker(pytest.mark.xdist_group(lane(item)))
    # each lane's last unit test: a failure stops the run once that lane's unit tests are done
    config.stash[_LAST_UNIT] = {lane(item): item for item in unit} if len(unit) < len(items) else {}
    config.stash[_UNIT_FAILED] = []


#: a file a lane writes when one of its unit tests failed: the other lane stops before its next test
UNIT_FAILED_FLAG = os.environ.setdefault(
    "TFMAGIC_TEST_UNIT_FAILED", os.path.join(tempfile.gettempdir(), f"tfmagic-unit-failed-{os.getpid()}")
)


_NICED = False

#: a folder where each lane keeps the test it is running: a timed check that missed names what ran beside it
LANES_DIR = os.environ.setdefault(
    "TFMAGIC_TEST_LANES", os.path.join(tempfile.gettempdir(), f"tfmagic-lanes-{os.getpid()}")
)


def chromium_at_lane_priority(chromium: str) -> str:
    """The Chromium to launch: one that keeps the priority of the lane that starts it.

    Run as root, Chromium lowers its browser and GPU processes' niceness to -8 and its zygotes' to 0
    whatever it inherited (measured: launched from a niceness-19 process). A niced lane's live
    dashboard pages then ran above the timed lane's paced clusters: two clean-clone runs missed a
    pace while test_browser's pages refreshed. Without CAP_SYS_NICE it cannot (``setpriv`` drops it;
    where that fails, Chromium starts as it is).
    """
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return chromium
    wrapper = os.path.join(tempfile.gettempdir(), f"tfmagic-chromium-{os.getpid()}.sh")
    if not os.path.exists(wrapper):
        drop = "setpriv --bounding-set -sys_nice --inh-caps -sys_nice"
        with open(wrapper + ".tmp", "w") as f:
            f.write(
                "#!/bin/sh\n"
                f'{drop} true 2>/dev/null && exec {drop} -- {shlex.quote(chromium)} "$@"\n'
                f'exec {shlex.quote(chromium)} "$@"\n'
            )
        os.chmod(wrapper + ".tmp", 0o700)
        os.replace(wrapper + ".tmp", wrapper)
    return wrapper


def load_per_core() -> float:
    """The machine's load (runnable processes, last minute) per core: what a timed miss is judged by."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


#: a file in LANES_DIR while a lane reruns a timed check that missed: the other lanes start no new test
QUIET = "quiet"
#: how long a rerun waits for the other lanes to finish the test they are in
QUIET_WAIT_S = 180.0


def hold_other_lanes(what: str) -> None:
    """Ask the other lanes to start no new test until this one ends, and wait (at most QUIET_WAIT_S)
    for the test each is in to end: a rerun of a timed check that a loaded machine missed then runs on
    an almost quiet one. The other lanes are longer by the rerun at most; the hold ends at this test's
    teardown (:func:`pytest_runtest_teardown`)."""
    os.makedirs(LANES_DIR, exist_ok=True)
    with open(os.path.join(LANES_DIR, QUIET), "w") as f:
        f.write(f"{os.getpid()} {what}")
    deadline = time.monotonic() + QUIET_WAIT_S
    idle = ("held", DONE)
    while time.monotonic() < deadline and not all(
        t.startswith(idle) for t in _other_lanes(_MY_LANE).values()
    ):
        time.sleep(0.5)


#: what a lane's file says once its worker has run its last test
DONE = "done"
#: the lane of this process's current test (tests/conftest.py writes it in LANES_DIR)
_MY_LANE = "timed"


def _other_lanes(own: str) -> dict[str, str]:
    found = {}
    for name in sorted(os.listdir(LANES_DIR)) if os.path.isdir(LANES_DIR) else []:
        if name not in (own, QUIET):
            try:
                with open(os.path.join(LANES_DIR, name)) as f:
                    found[name] = f.read().strip()
            except OSError:
                continue
    return found


def _wait_while_held(name: str) -> None:
    """A lane's next test waits while another lane reruns a timed check (:func:`hold_other_lanes`)."""
    path = os.path.join(LANES_DIR, QUIET)
    while os.path.exists(path):
        try:
            with open(path) as f:
                holder, _, what = f.read().partition(" ")
            os.kill(int(holder), 0)  # a holder that died holds nothing
        except (OSError, ValueError):
            return
        with open(os.path.join(LANES_DIR, name), "w") as f:
            f.write(f"held while the timed lane reruns {what}")
        time.sleep(0.5)


def beside(own: str = "timed") -> str:
    """What the other lanes were running (their current tests), for a timed check that missed."""
    found = [f"{name} lane: {text or 'nothing'}" for name, text in _other_lanes(own).items()]
    return "; ".join(found) or "no other lane"


def cpu_of(pid: int) -> str:
    """How much a process ran and how long its threads waited for a CPU (``/proc/PID/task/*/schedstat``):
    what tells a starved process (the niced lane beside a busy timed lane) from a stuck one."""
    ran = waited = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            ran, waited = ran + int(fields[0]), waited + int(fields[1])
    except OSError:
        return f"process {pid} is gone"
    return f"process {pid} ran {ran / 1e9:.1f} s and its threads waited {waited / 1e9:.1f} s for a CPU"


def ran_again(what: str, why: str) -> None:
    """Say, in the test summary and ``test-artifacts/reruns.log``, that a timed check a loaded run
    missed ran once more (what a lesson tells a student: the machine was busy, run it again). A test
    that passes on its second run must not hide its first: the load and the other lane's test are kept."""
    import warnings

    line = f"{what}: did not hold (load {load_per_core():.1f} per core; {beside()}) and ran again: {why}"
    os.makedirs(os.path.join(ROOT, "test-artifacts"), exist_ok=True)
    with open(os.path.join(ROOT, "test-artifacts", "reruns.log"), "a") as log:
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
    warnings.warn(line, stacklevel=2)
    hold_other_lanes(what)


def kept_pace(what: str, train: Callable[[], object]):
    """A paced run (``train()`` returns its History) whose pace the machine kept: run once more, through
    :func:`ran_again`, when the run itself said the machine could not keep it. What the test then
    checks is the model's figures, which a late run does not show (the run says so, and teaches the
    machine instead)."""
    history = train()
    missed = [n for n in history.notes if "could not keep" in n]
    if missed:
        ran_again(what, missed[0])
        history = train()
    return history


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A niced lane's worker lowers its priority before its first fixture starts anything; the
    other lanes stop before their next test once a unit test of one lane has failed."""
    global _NICED
    if not _NICED and os.environ.get("PYTEST_XDIST_WORKER") and lane(item) != "timed":
        os.nice(REST_NICE)
        _NICED = True
    global _MY_LANE
    _MY_LANE = lane(item)
    os.makedirs(LANES_DIR, exist_ok=True)
    _wait_while_held(_MY_LANE)
    with open(os.path.join(LANES_DIR, _MY_LANE), "w") as f:
        f.write(item.nodeid)
    if os.path.exists(UNIT_FAILED_FLAG):
        item.session.shouldstop = "a unit test failed in the other lane: the slower tiers were not run"
        pytest.skip("a unit test failed: fix the fast tier first")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    """A hold this lane's test asked for (:func:`hold_other_lanes`) ends with the test."""
    path = os.path.join(LANES_DIR, QUIET)
    try:
        with open(path) as f:
            mine = f.read().partition(" ")[0] == str(os.getpid())
        if mine:
            os.remove(path)
    except OSError:
        pass


def pytest_sessionstart(session):
    if not os.environ.get("PYTEST_XDIST_WORKER") and os.path.exists(UNIT_FAILED_FLAG):
        os.remove(UNIT_FAILED_FLAG)  # (a pid of an earlier run)


def pytest_sessionfinish(session):
    if os.environ.get("PYTEST_XDIST_WORKER") and os.path.exists(os.path.join(LANES_DIR, _MY_LANE)):
        with open(os.path.join(LANES_DIR, _MY_LANE), "w") as f:
            f.write(DONE)  # a rerun in another lane need not wait for this one
    if not os.environ.get("PYTEST_XDIST_WORKER") and os.path.exists(UNIT_FAILED_FLAG):
        os.remove(UNIT_FAILED_FLAG)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(LANES_DIR, ignore_errors=True)


def _is_unit(item) -> bool:
    return item.get_closest_marker("unit") is not None and not any(
        item.get_closest_marker(t) for t in TIERS[1:]
    )


_LAST_UNIT = pytest.StashKey[object]()
_UNIT_FAILED = pytest.StashKey[list]()


def _cpu_seconds() -> float:
    """CPU this test process and the children it has reaped have used (kernels, launchers, tasks)."""
    import resource

    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


_CPU_AT_START: dict[str, float] = {}


def pytest_runtest_logstart(nodeid, location):
    _CPU_AT_START[nodeid] = _cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "teardown" and item.nodeid in _CPU_AT_START:
        # CI is CPU-bound on two cores: the JUnit XML carries each test's CPU beside its time
        # (tests/durations.py sums both). A process counts when it is reaped, so a shared
        # fixture's processes count in the test whose tear-down ended them.
        report.user_properties.append(("cpu_s", f"{_cpu_seconds() - _CPU_AT_START.pop(item.nodeid):.1f}"))
    failed = item.config.stash.get(_UNIT_FAILED, None)
    if failed is not None and report.failed and _is_unit(item):
        failed.append(item.nodeid)
    last = item.config.stash.get(_LAST_UNIT, {})
    if call.when == "teardown" and failed and item is last.get(lane(item)):
        item.session.shouldstop = (
            f"{len(failed)} unit test(s) failed (first {failed[0]}): the slower tiers were not run; "
            "fix the fast tier first"
        )
        with open(UNIT_FAILED_FLAG, "w") as flag:
            flag.write(failed[0])
    return report


def poll_for(
    predicate: Callable[[], object],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str | Callable[[], str] = "condition",
):
    """Wait until ``predicate()`` is truthy and return it; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}"
            )
        time.sleep(interval)


#: Marks every process this test run starts (tasks inherit it through kernels
#: and launchers), so the leak check sees this run's tasks, also once orphaned
#: and re-parented, and never another run's on the same machine.
RUN_MARK = f"{os.getpid()}-{time.time_ns()}"
os.environ["TFMAGIC_TEST_RUN"] = RUN_MARK


def _ours(proc: psutil.Process) -> bool:
    try:
        if os.getpid() in {p.pid for p in proc.parents()}:
            return True
        return proc.environ().get("TFMAGIC_TEST_RUN") == RUN_MARK
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def task_processes() -> dict[int, str]:
    """This test run's tfmagic task processes: pid -> command line.

    A task is this run's if it descends from this process (local tasks,
    kernels' tasks, tasks under the tests' own sshd and Spark) or carries
    :data:`RUN_MARK` (an orphan whose parent died).
    """
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "tfmagic.task_main" in cmd and _ours(proc):
            found[proc.info["pid"]] = " ".join(cmd)
    return found


def assert_gone(pids, timeout: float = 15.0) -> None:
    """Every pid in ``pids`` ends within ``timeout`` (zombies count as gone)."""

    def all_gone():
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                pass
        return True

    poll_for(all_gone, timeout, what=f"processes {sorted(pids)} to end")


#: Callables returning pids that shared (module/session) fixtures own; the
#: leak check leaves those alone.
SHARED: list[Callable[[], set[int]]] = []


def share(cluster, pool=None) -> Callable[[], set[int]]:
    """Register a fixture's cluster (and spare pool) as shared; returns the handle to unregister."""

    def pids() -> set[int]:
        found = {p.pid for p in cluster.procs.values()}
        relay = getattr(cluster, "shaper", None)  # its modelled network's relay (started again after a kill)
        if relay is not None and relay.pid:
            found.add(relay.pid)
        if pool is not None:
            found |= {p.pid for p in pool.processes()}
        return found

    SHARED.append(pids)
    return pids


@pytest.fixture(scope="session")
def local_cluster():
    """A 1 ps + 2 worker cluster shared by the whole session."""

    cluster = tfmagic.LocalCluster(ps=1, workers=2, name="session", spares=False)
    cluster.start()
    handle = share(cluster)
    yield cluster
    SHARED.remove(handle)
    pids = [p.pid for p in cluster.procs.values()]
    cluster.close()
    assert_gone(pids)


@pytest.fixture
def no_leaks(request):
    """Fail the test if it leaves task processes behind (besides shared fixtures)."""
    before = set(task_processes())
    yield
    from tfmagic.procs import owner

    def shared() -> set[int]:
        return set().union(*(f() for f in SHARED)) if SHARED else set()

    def leftovers():
        keep = before | shared()
        return {pid: cmd for pid, cmd in task_processes().items() if pid not in keep}

    try:
        poll_for(lambda: not leftovers(), 15, what="task processes started by the test to end")
    except AssertionError:
        left = leftovers()
        for pid in left:  # clean up so one failure does not cascade
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        raise AssertionError(f"test left task processes behind: {left}")

    # a spare being spawned is the owner's a moment before its pool lists it: look again
    def strays() -> list[str]:
        found = []
        for p in owner.processes():
            if p.pid not in shared() | before:
                try:
                    found.append(f"{p.pid} {' '.join(psutil.Process(p.pid).cmdline()[:4])}")
                except psutil.Error:
                    found.append(f"{p.pid} (gone)")
        return found

    poll_for(
        lambda: not strays(),
        15,
        what=lambda: f"every process this test started to end (or belong to a shared fixture): {strays()}",
    )


def magic_refusal(line: str) -> str:
    """What ``%tf_cluster LINE`` says when it refuses (a UsageError, one line), checked to have left
    the session without a cluster: a bad start starts nothing."""
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    from tfmagic import session
    from tfmagic.magics.cluster import ClusterMagics

    magics = ClusterMagics(shell=InteractiveShell.instance())
    sess = session.default()
    previous, sess.cluster = sess.cluster, None
    try:
        with pytest.raises(UsageError) as err:
            magics.tf_cluster(line)
        message = str(err.value)
        assert "\n" not in message, message
        assert sess.cluster is None
        return message
    finally:
        sess.cluster = previous


def bytes_moved(before, after, src_job: str, dst_job: str) -> int:
    """Bytes sent from tasks of ``src_job`` to tasks of ``dst_job`` between two ``cluster.traffic()`` readings."""
    return sum(
        row["bytes"] - before.between(row["src"], row["dst"])
        for row in after
        if row["src"].startswith(src_job) and row["dst"].startswith(dst_job)
    )


def card_read(cluster, rate: str = "20mbit", task: str = "ps:0") -> tuple[float, int]:
    """Read 2.5 MB from ``task`` through its modelled card at ``rate`` (set for the read, lifted after):
    (seconds the read took, bytes the card passed out of the task meanwhile). The variable is read once
    before, so the timed read pays no placement. The cluster must have a relay for ``task``."""
    import tensorflow as tf

    cluster.connect()
    with tf.device(f"/job:{task.split(':')[0]}/task:{task.split(':')[1]}"):
        v = tf.Variable(tf.zeros([625_000]))  # 2.5 MB
    v.read_value().numpy()
    before = cluster.shaper.routes()[task]["out"]
    cluster.net(task, rate=rate)
    try:
        t0 = time.monotonic()
        v.read_value().numpy()
        took = time.monotonic() - t0
    finally:
        cluster.net(task, rate=None)
    return took, cluster.shaper.routes()[task]["out"] - before


#: A TensorFlow client in a process of its own: a graph (6 * 7) sent to each target given as
#: ``name=grpc://host:port`` (a bare target is its own name), with an 8 s deadline; prints JSON of
#: what each returned or its error's type, and the process's uid. ``TFMAGIC_TEST_SITEDIRS`` (when
#: set) adds site directories first, for a Python run as another user (tests/test_loopback.py).
GRAPH_PROBE = """
import json, os, site, sys
for d in filter(None, os.environ.get("TFMAGIC_TEST_SITEDIRS", "").split(os.pathsep)):
    site.addsitedir(d)
import tensorflow as tf
results = {"uid": os.getuid()}
for arg in sys.argv[1:]:
    name, _, target = arg.rpartition("=")
    with tf.Graph().as_default():
        x = tf.constant(6.0) * tf.constant(7.0)
        config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=8000)
        try:
            with tf.compat.v1.Session(target, config=config) as session:
                results[name or target] = float(session.run(x))
        except tf.errors.OpError as exc:
            results[name or target] = type(exc).__name__
print(json.dumps(results))
"""
