"""A task process on its own: how it ends, what a cell may read, and what it answers at once.

Every test starts real ``python -m tfmagic.task_main`` processes the way the
launchers do (pipes for the channel, the log as stderr, a session of their
own) and talks the JSON-lines protocol to them directly, without a launcher
or a cluster, so each finding is shown on the task process alone.  Owners
that must die by ``kill -9`` are small scripts (:data:`OWNER`) that spawn the
task, start its cell, print the task's pid and sleep.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tfmagic.network import bindguard
from tfmagic.network.ports import free_port
from tfmagic.procs import stats

from .conftest import assert_gone, poll_for

REPO = str(Path(__file__).resolve().parents[1])
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TFMAGIC_BIND_HOST")}
    env.update(
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
    )
    env.pop("TF_CONFIG", None)
    env.update(extra or {})
    return env


def _kill(pids) -> None:
    """SIGKILL each pid still alive (cleanup: only processes this test started)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Task:
    """One task process driven by this test process over its pipes (read synchronously)."""

    def __init__(self, log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        with open(log, "ab") as f:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tfmagic.task_main"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=f,
                env=_env(env),
                start_new_session=True,
                close_fds=True,
                cwd=REPO,
            )
        self.pid = self.popen.pid
        self._buf = b""
        self._seq = 0
        self.hello = self.until(lambda m: m.get("event") == "hello", 60)

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])

    def send(self, op: str, **fields) -> None:
        self.popen.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode())
        self.popen.stdin.flush()

    def until(self, predicate, timeout: float = 60.0) -> dict:
        """Read events until one satisfies ``predicate``; fail on timeout or end of stream."""
        deadline = time.monotonic() + timeout
        fd = self.popen.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, _, self._buf = self._buf.partition(b"\n")
                msg = json.loads(line)
                if msg.get("event") in ("fatal", "assign_failed"):
                    raise AssertionError(f"task failed: {msg}\n{self.log_tail()}")
                if predicate(msg):
                    return msg
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching event within {timeout:g} s; log:\n{self.log_tail()}")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                data = os.read(fd, 65536)
                if not data:
                    raise AssertionError(f"the task's channel ended; log:\n{self.log_tail()}")
                self._buf += data

    def request(self, op: str, timeout: float = 30.0, **fields) -> dict:
        self._seq += 1
        rid = f"t-{self._seq}"
        self.send(op, id=rid, **fields)
        return self.until(lambda m: m.get("id") == rid and m.get("event") != "stream", timeout)

    def assign(self, job: str = "worker", index: int = 0) -> dict:
        addresses = [f"127.0.0.1:{free_port()}" for _ in range(index + 1)]
        self.port = int(addresses[index].rsplit(":", 1)[1])
        self.send("assign", job=job, index=index, cluster={job: addresses})
        return self.until(lambda m: m.get("event") == "ready", 90)

    def exec(self, code: str, timeout: float = 120.0) -> dict:
        return self.request("exec", timeout, code=code)

    def close(self) -> None:
        _kill([self.pid])
        self.popen.wait(timeout=10)
        for stream in (self.popen.stdin, self.popen.stdout):
            try:
                stream.close()
            except OSError:
                pass


#: An owner that can be killed with SIGKILL: it spawns a task as the launchers do,
#: optionally gives it a role and starts a cell, prints the task's pid (and the
#: cell's first line of output), then sleeps without reading any more.
OWNER = textwrap.dedent(
    """
    import json, os, socket, subprocess, sys, time
    cfg = json.loads(sys.argv[1])
    env = dict(os.environ, **cfg.get("env", {}))
    if cfg.get("owner_pid"):
        env["TFMAGIC_OWNER_PID"] = str(os.getpid())
    with open(cfg["log"], "ab") as log:
        task = subprocess.Popen(
            [sys.executable, "-m", "tfmagic.task_main"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log, env=env, start_new_session=True, close_fds=True,
        )
    def send(**msg):
        task.stdin.write((json.dumps(msg) + "\\n").encode())
        task.stdin.flush()
    def until(predicate):
        for line in task.stdout:
            msg = json.loads(line)
            if msg.get("event") in ("fatal", "assign_failed"):
                print(json.dumps({"task": task.pid, "error": msg}), flush=True)
                time.sleep(600)
            if predicate(msg):
                return msg
        print(json.dumps({"task": task.pid, "error": "the channel ended"}), flush=True)
        time.sleep(600)
    until(lambda m: m.get("event") == "hello")
    text = None
    if cfg.get("cell"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        send(op="assign", job="worker", index=0, cluster={"worker": [f"127.0.0.1:{port}"]})
        until(lambda m: m.get("event") == "ready")
        send(op="exec", id="cell", code=cfg["cell"])
        text = until(lambda m: m.get("event") == "stream" and cfg["marker"] in m.get("text", ""))["text"]
    print(json.dumps({"task": task.pid, "text": text}), flush=True)
    time.sleep(600)
    """
)


class Owner:
    """A running :data:`OWNER` script and the task it spawned."""

    def __init__(self, log: Path, **cfg) -> None:
        self.log = log
        self.popen = subprocess.Popen(
            [sys.executable, "-c", OWNER, json.dumps({"log": str(log), **cfg})],
            stdout=subprocess.PIPE,
            env=_env(),
            cwd=REPO,
            text=True,
        )
        ready, _, _ = select.select([self.popen.stdout], [], [], 180)
        line = self.popen.stdout.readline() if ready else ""
        if not line:
            self.kill()
            raise AssertionError(f"the owner script said nothing; task log:\n{self._tail()}")
        self.report = json.loads(line)
        self.task = int(self.report["task"])
        if self.report.get("error"):
            _kill([self.task])
            self.kill()
            raise AssertionError(f"the owner script failed: {self.report['error']}\n{self._tail()}")

    def _tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            return ""

    def kill(self) -> None:
        """``kill -9`` of the owner, and reap it."""
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        self.popen.stdout.close()


# --- 1. the owner's kill -9 ends the task, whatever its cell is doing ----------------------------

PRINT_LOOP = "print('started', flush=True)\nwhile True:\n    print('x' * 200)\n"
BREAKPOINT = "print('started', flush=True)\nbreakpoint()\nprint('never')\n"


@pytest.mark.cluster
@pytest.mark.parametrize("cell", [PRINT_LOOP, BREAKPOINT], ids=["printing-loop", "breakpoint"])
def test_kill_9_of_the_owner_while_a_cell_runs_ends_the_task(tmp_path, cell):
    owner = Owner(tmp_path / "task.log", cell=cell, marker="started")
    try:
        assert _alive(owner.task)
        owner.kill()
        assert_gone([owner.task], timeout=10)
        log = (tmp_path / "task.log").read_text(errors="replace")
        assert f"tfmagic task {owner.task}: exiting:" in log
    finally:
        _kill([owner.task])
        owner.kill()


@pytest.mark.cluster
def test_closing_the_channel_while_a_cell_prints_ends_the_task(tmp_path):
    task = Task(tmp_path / "task.log")
    try:
        task.assign()
        task.send("exec", id="loop", code=PRINT_LOOP)
        task.until(lambda m: m.get("event") == "stream" and "started" in m.get("text", ""), 120)
        task.popen.stdin.close()
        task.popen.stdout.close()
        task.popen.wait(timeout=10)
        assert "exiting: the owner" in task.log.read_text(errors="replace")
    finally:
        task.close()


# --- 2. what a cell started dies with the task, in a session of its own too ----------------------

SPAWN_CHILDREN = textwrap.dedent(
    """
    import subprocess
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    # a grandchild in a session of its own whose parent (sh) exits at once: it re-parents
    out = subprocess.run(
        ["sh", "-c", "setsid sleep 301 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
    ).stdout
    print("PIDS", child.pid, int(out), flush=True)
    """
)


@pytest.mark.cluster
def test_children_of_a_cell_die_with_the_task_even_in_their_own_session(tmp_path):
    owner = Owner(tmp_path / "task.log", cell=SPAWN_CHILDREN, marker="PIDS")
    child, grandchild = map(int, owner.report["text"].split()[1:3])
    try:
        assert psutil.Process(child).ppid() == owner.task
        # `$!` is the pid of sh's fork, which is in the task's session until it has run setsid(2): the
        # report can come first (a CI run met it), so wait for both before asserting on them
        poll_for(
            lambda: (
                psutil.Process(grandchild).ppid() == owner.task
                and os.getsid(grandchild) != os.getsid(owner.task)
            ),
            10,
            what="the grandchild re-parented to the task in a session of its own",
        )
        assert os.getsid(child) != os.getsid(owner.task)
        owner.kill()
        assert_gone([owner.task, child, grandchild], timeout=10)
    finally:
        _kill([owner.task, child, grandchild])
        owner.kill()


# --- 3. a stopped task still dies with its owner (TFMAGIC_PDEATHSIG=1) ---------------------------


@pytest.mark.cluster
def test_a_stopped_task_dies_with_its_owner_when_pdeathsig_is_asked_for(tmp_path):
    owner = Owner(tmp_path / "task.log", env={"TFMAGIC_PDEATHSIG": "1"}, owner_pid=True)
    try:
        os.kill(owner.task, signal.SIGSTOP)
        poll_for(lambda: psutil.Process(owner.task).status() == psutil.STATUS_STOPPED, 10, what="SIGSTOP")
        owner.kill()
        assert_gone([owner.task], timeout=5)
    finally:
        _kill([owner.task])
        owner.kill()


@pytest.mark.unit
def test_a_task_whose_owner_died_before_it_set_pdeathsig_ends_at_once(tmp_path):
    """The race: the parent is not the owner named in TFMAGIC_OWNER_PID any more."""
    log = tmp_path / "task.log"
    with open(log, "ab") as f:
        popen = subprocess.Popen(
            [sys.executable, "-m", "tfmagic.task_main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=f,
            env=_env({"TFMAGIC_PDEATHSIG": "1", "TFMAGIC_OWNER_PID": "1"}),
            start_new_session=True,
            cwd=REPO,
        )
    try:
        out, _ = popen.communicate(timeout=20)
        assert out == b"", "it ends before saying hello"
        assert "the owner (pid 1) was gone before this task started" in log.read_text()
    finally:
        _kill([popen.pid])
        popen.wait(timeout=10)


# --- 4, 5: one task with a role, the bind guard and PDEATHSIG, for the rest ----------------------


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    guard = bindguard.bind_guard("127.0.0.1", base_env=_env())
    assert guard.available, guard.reason
    env = {**guard.env, "TFMAGIC_PDEATHSIG": "1", "TFMAGIC_OWNER_PID": str(os.getpid())}
    proc = Task(tmp_path_factory.mktemp("task") / "task.log", env)
    try:
        proc.assign("worker", 1)
        yield proc
    finally:
        proc.close()
        assert_gone([proc.pid])


@pytest.mark.cluster
@pytest.mark.parametrize(
    "code",
    [
        "input('how many? ')",
        "breakpoint()",
        "import sys\nsys.stdin.read()",
        "import sys\nsys.stdin.buffer.read()",
    ],
    ids=["input", "breakpoint", "stdin.read", "stdin.buffer.read"],
)
def test_a_cell_that_reads_input_fails_with_one_line_and_the_task_keeps_serving(task, code):
    reply = task.exec(code)
    assert reply["status"] == "error", reply
    assert reply["ename"] == "TaskHasNoInput"
    assert reply["evalue"] == (
        "worker:1: a %%tf_px cell cannot read input (input(), breakpoint(), pdb): "
        "a task has no keyboard; put the values in the cell"
    )
    after = task.exec("6 * 7")
    assert after["status"] == "ok" and after["repr"] == "42", after
    assert task.request("ping", 10)["event"] == "pong"


@pytest.mark.cluster
def test_a_cells_child_process_reads_dev_null_not_the_channel(task):
    reply = task.exec(
        "import os, subprocess\n"
        "r = subprocess.run(['cat'], capture_output=True, timeout=20)\n"
        "(r.returncode, r.stdout, os.readlink('/proc/self/fd/0'), os.environ.get('TFMAGIC_PDEATHSIG'))"
    )
    assert reply["status"] == "ok", reply
    assert reply["repr"] == "(0, b'', '/dev/null', None)"
    assert task.request("ping", 10)["event"] == "pong"


@pytest.mark.cluster
def test_listening_answers_where_the_task_listens(task):
    reply = task.request("listening", 10)
    assert reply["event"] == "listening" and reply["pid"] == task.pid
    addresses = {tuple(a) for a in reply["addresses"]}
    assert task.port in {port for _, port in addresses}, addresses
    assert {host for host, _ in addresses} <= LOOPBACK, f"the bind guard holds: {addresses}"
    assert set(stats.listening_addresses(task.pid)) == addresses


@pytest.mark.unit
def test_listening_addresses_of_a_plain_process():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert ("127.0.0.1", port) in stats.listening_addresses(os.getpid())
    assert ("127.0.0.1", port) not in stats.listening_addresses(os.getpid())
    assert stats.listening_addresses(2**22 + 1) == []  # beyond pid_max: no such process


@pytest.mark.cluster
def test_stacks_shows_every_thread_while_a_cell_runs_and_interrupt_wakes_it(task):
    task.send(
        "exec", id="stuck", code="import time\ndef waiting_here():\n    time.sleep(60)\nwaiting_here()\n"
    )

    def stacks():
        reply = task.request("stacks", 10)
        return reply if "waiting_here" in reply["threads"][0]["stack"] else None

    reply = poll_for(stacks, 60, interval=0.2, what="the cell to be in waiting_here()")
    names = [t["name"] for t in reply["threads"]]
    assert names[0] == "MainThread" and "tfmagic-ops" in names and "tfmagic-parent" in names, names
    assert reply["exec_id"] == "stuck" and reply["task"] == "worker:1" and reply["pid"] == task.pid
    assert "time.sleep(60)" in reply["threads"][0]["stack"]
    ops = next(t for t in reply["threads"] if t["name"] == "tfmagic-ops")
    assert ops["current"] and "urgent_stacks" in ops["stack"]
    t0 = time.monotonic()
    task.send("interrupt", exec_id="stuck")
    done = task.until(lambda m: m.get("id") == "stuck" and m.get("event") == "exec_done", 30)
    assert done["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - t0 < 5, "the interrupt woke the cell's time.sleep, not after it"


@pytest.mark.cluster
def test_orphans_that_end_are_reaped_but_a_cells_own_children_are_left_to_it(task):
    """The task is a subreaper: it reaps orphans that ended, never a child a cell waits for."""
    start = task.exec(
        "import subprocess\n"
        "p = subprocess.Popen(['sh', '-c', 'sleep 4 >/dev/null 2>&1 & echo $!; sleep 3; exit 3'],"
        " stdout=subprocess.PIPE, text=True)\n"
        "int(p.stdout.readline())"
    )
    assert start["status"] == "ok", start
    orphan = int(start["repr"])
    assert psutil.Process(orphan).ppid() != task.pid  # sh's child for now

    def reaped():
        try:
            psutil.Process(orphan)  # alive, or a zombie nobody reaped
            return False
        except psutil.NoSuchProcess:
            return True

    poll_for(reaped, 20, what="the orphan to re-parent to the task, end and be reaped")
    done = task.exec("p.wait(timeout=20)")
    assert done["status"] == "ok" and done["repr"] == "3", f"the cell's own child kept its exit code: {done}"


# --- 6 (the task's side): a task that builds its own guard, with a cache others may write ----------


@pytest.mark.cluster
def test_a_self_guarding_task_with_an_untrusted_cache_uses_a_private_library_and_removes_it(tmp_path):
    """As remote launchers start tasks (TFMAGIC_GUARD_HOST): the task builds the library, re-execs."""
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    task = Task(tmp_path / "task.log", {"TFMAGIC_GUARD_HOST": "127.0.0.1", "TFMAGIC_CACHE_DIR": str(cache)})
    try:
        assert task.hello["bind_host"] == "127.0.0.1" and not task.hello["guard_failed"]
        environ = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{task.pid}/environ").read_text().split("\0")
            if "=" in item
        )
        library = environ["LD_PRELOAD"].split(":")[0]
        private = os.path.dirname(library)
        assert not library.startswith(str(cache)) and os.path.isfile(library)
        assert os.stat(private).st_mode & 0o777 == 0o700
        assert library in Path(f"/proc/{task.pid}/maps").read_text()
        assert list(cache.iterdir()) == [], "nothing was written to the shared cache"
        task.popen.stdin.close()  # the owner goes away
        task.popen.wait(timeout=15)
        assert not os.path.exists(private), "the task removed its private library at its end"
    finally:
        task.close()
