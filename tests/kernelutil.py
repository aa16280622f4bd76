"""Drive a real IPython kernel (jupyter_client) the way a notebook does."""

from __future__ import annotations

import atexit
import os
import queue
import re
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client.manager import KernelManager

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(text: str) -> str:
    """``text`` without its terminal colours (IPython's tracebacks, a failed cell's error)."""
    return _ANSI.sub("", text)


def why_it_died(stderr: str) -> str:
    """The lines of a dead process's stderr that say why it aborted: TensorFlow's F-lines and CHECK
    failures, C++ terminate, Python's fatal error header, and the frames of tfmagic and TensorFlow in the
    stacks faulthandler prints. The tail alone is IPython's part of the stack, which names no cause.

    A kernel's own cause is often lost: ipykernel reads fd 2 through a pipe, and an abort ends the
    process before that pipe is read; faulthandler writes to the original stderr and survives."""
    marks = ("F0000", "Check failed", "terminate called", "Fatal Python error", "Mutex", "poisoned")
    frames = ("Thread 0x", "/tfmagic/", "/tensorflow/")
    found, current = [], False
    for line in stderr.splitlines():
        if line.startswith(("Thread 0x", "Current thread")):
            current = line.startswith("Current thread")
        elif not line.startswith("  "):
            current = False
        if current or any(m in line for m in marks + frames):
            found.append(line)
    return ("why it aborted:\n" + "\n".join(found[-60:]) + "\n") if found else ""


class KernelAborted(AssertionError):
    """A kernel died of SIGABRT inside TensorFlow (issue 22 item 11)."""


def aborted(stderr: str) -> bool:
    """Whether a dead process's stderr or log says it aborted (``abort()``: TensorFlow's failed checks,
    absl's corrupt mutex), as opposed to any other death."""
    return "Fatal Python error: Aborted" in stderr


def record_abort(what: str, why: str) -> None:
    """Keep a kernel's abort where the CI's artifacts are, and say so in the test summary: a test
    that reruns after one must not hide that it happened."""
    import warnings

    root = Path(__file__).resolve().parents[1] / "test-artifacts"
    root.mkdir(exist_ok=True)
    with open(root / "kernel-aborts.log", "a") as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n{why}\n")
    warnings.warn(
        f"{what}: the kernel aborted inside TensorFlow and ran again; see test-artifacts/kernel-aborts.log",
        stacklevel=2,
    )


def kernel_log_of(pid: int | None) -> str:
    """The tfmagic kernel log a dead kernel left (its runtime directory outlives an abort): where
    its fatal Python stacks and the native lines read before it died are."""
    import glob
    import tempfile as _tempfile

    if pid is None:
        return ""
    for owner in glob.glob(os.path.join(_tempfile.gettempdir(), "tfmagic-*", ".owner")):
        try:
            if Path(owner).read_text().split()[0] == str(pid):
                return (Path(owner).parent / "kernel-native.log").read_text(errors="replace")
        except (OSError, IndexError):
            continue
    return ""


@dataclass
class Reply:
    status: str
    streams: str = ""
    stdout: str = ""
    stderr: str = ""
    displays: list[dict] = field(default_factory=list)
    display_ids: list[str | None] = field(default_factory=list)  # beside displays
    error: dict | None = None
    errors: list[dict] = field(default_factory=list)
    result: dict | None = None

    @property
    def text(self) -> str:
        """Everything a person would read, as text."""
        parts = [self.streams]
        for d in self.displays + ([self.result] if self.result else []):
            parts.append(d.get("text/plain", ""))
        for err in self.errors:
            parts.append("\n".join(err.get("traceback", [])))
        return plain("\n".join(parts))

    @property
    def html(self) -> str:
        return "\n".join(
            d.get("text/html", "") for d in self.displays + ([self.result] if self.result else [])
        )


class Kernel:
    """A real ipykernel in its own process, with helpers to run cells."""

    def __init__(self, env: dict[str, str] | None = None):
        self.km = KernelManager(kernel_name="python3")
        kenv = dict(os.environ)
        kenv.update(env or {})
        # ipykernel turns off forwarding of fd 1/2 to the frontend when it sees
        # pytest; a notebook user has it on, so the tests must too.
        # tests/cpu_by_process.py counts the kernel and its tasks for the test that started it
        kenv["TFMAGIC_TEST_STARTED_BY"] = kenv.pop("PYTEST_CURRENT_TEST", "")
        # A native crash (SIGSEGV inside TensorFlow) then leaves every thread's Python stack in
        # the stderr file below, which a failing test quotes.
        kenv.setdefault("PYTHONFAULTHANDLER", "1")
        # The kernel's own stderr (what it prints outside cells, and how it died) goes to a file,
        # quoted when the kernel dies or a cell times out.
        fd, path = tempfile.mkstemp(prefix="tfmagic-test-kernel-", suffix=".stderr")
        self.stderr_path = Path(path)
        self._stderr = os.fdopen(fd, "wb")
        self.km.start_kernel(env=kenv, stderr=self._stderr)
        atexit.register(self._last_resort)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        # SIGUSR2 makes the kernel write every thread's Python stack to the stderr file: a cell that
        # times out quotes where it waits (a hang in CI is otherwise one line saying it did not finish).
        self.kc.execute(
            "__import__('faulthandler').register(__import__('signal').SIGUSR2, "
            f"file=open({str(self.stderr_path)!r}, 'a'), all_threads=True)",
            silent=True,
            store_history=False,
        )
        #: why every later cell fails at once (a cell that ignored its interrupt), or None
        self.wedged: str | None = None
        #: output published outside a running cell's reply (background threads), newest last
        self.others: deque[dict] = deque(maxlen=2000)

    @property
    def pid(self) -> int:
        return self.km.provisioner.pid

    def run(
        self,
        code: str,
        timeout: float = 120.0,
        interrupt_after: float | None = None,
        until: str | None = None,
    ) -> Reply:
        """Run a cell; with ``until``, keep reading streams (fd-level output
        arrives late) until that text has appeared."""
        if self.wedged:
            raise TimeoutError(f"the kernel is wedged: {self.wedged}")
        msg_id = self.kc.execute(code)
        reply = Reply(status="?")
        deadline = time.monotonic() + timeout
        interrupt_at = None if interrupt_after is None else time.monotonic() + interrupt_after
        idle = False
        while not idle or (until is not None and until not in reply.streams):
            if interrupt_at is not None and time.monotonic() > interrupt_at:
                self.km.interrupt_kernel()
                interrupt_at = None
            if time.monotonic() > deadline:
                why = (
                    f"cell did not finish in {timeout} s: {code[:200]!r}\nso far: {reply.text[-2000:]}"
                    f"\nthe kernel's stderr ends:\n{self.stderr_tail()}\n{self.threads()}"
                )
                if not self._interrupt(msg_id):
                    # Every later cell would queue behind this one and wait out its own timeout.
                    self.wedged = f"an earlier cell did not finish, even interrupted: {code[:200]!r}"
                raise TimeoutError(why)
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                self._check_alive(code)
                continue
            if msg["parent_header"].get("msg_id") != msg_id and not (idle and msg["msg_type"] == "stream"):
                self.others.append(msg)
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                reply.streams += content["text"]
                if content["name"] == "stdout":
                    reply.stdout += content["text"]
                else:
                    reply.stderr += content["text"]
            elif kind in ("display_data", "update_display_data"):
                reply.displays.append(content["data"])
                reply.display_ids.append((content.get("transient") or {}).get("display_id"))
                if kind == "update_display_data":
                    self.others.append(msg)
            elif kind == "execute_result":
                reply.result = content["data"]
            elif kind == "error":
                reply.error = content
                reply.errors.append(content)
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
        shell = self.kc.get_shell_msg(timeout=30)
        while shell["parent_header"].get("msg_id") != msg_id:
            shell = self.kc.get_shell_msg(timeout=30)
        reply.status = shell["content"]["status"]
        for payload in shell["content"].get("payload", []):
            if payload.get("source") == "page":  # `magic?` help arrives as a pager payload
                reply.displays.append(payload.get("data", {}))
        if reply.error is None and reply.status == "error":
            # IPython prints a UsageError as one stderr line; the reply still names it.
            reply.error = dict(shell["content"], traceback=[])
        return reply

    def ok(self, code: str, timeout: float = 120.0) -> Reply:
        reply = self.run(code, timeout)
        assert reply.status == "ok", reply.text[-3000:]
        return reply

    def value(self, expr: str):
        """Evaluate ``expr`` in the kernel and return it (via repr/literal_eval)."""
        import ast

        reply = self.ok(f"print(repr({expr}))")
        return ast.literal_eval(reply.stdout.strip().splitlines()[-1])

    def updates_of(self, display_id: str) -> list[dict]:
        """The data of every update_display_data seen for ``display_id`` (from any cell or thread)."""
        self.drain()
        return [
            m["content"]["data"]
            for m in self.others
            if m["msg_type"] == "update_display_data"
            and (m["content"].get("transient") or {}).get("display_id") == display_id
        ]

    def drain(self, quiet: float = 0.2) -> None:
        """Move output waiting on the iopub channel into ``others``."""
        while True:
            try:
                self.others.append(self.kc.get_iopub_msg(timeout=quiet))
            except queue.Empty:
                return

    def _interrupt(self, msg_id: str, wait: float = 15.0) -> bool:
        """Interrupt a cell that ran past its timeout; whether the kernel went idle after it."""
        try:
            self.km.interrupt_kernel()
        except Exception:  # noqa: BLE001 - a dead kernel is reported by the caller's error
            return False
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                return True
            self.others.append(msg)
        return False

    def threads(self) -> str:
        """Every thread's Python stack in the kernel now (faulthandler, on SIGUSR2), for a cell that hangs."""
        import signal

        try:
            before = self.stderr_path.stat().st_size
            os.kill(self.pid, signal.SIGUSR2)
            time.sleep(1.0)
            with open(self.stderr_path, "rb") as f:
                f.seek(before)
                dump = f.read().decode(errors="replace")
        except (OSError, TypeError):
            return ""
        return f"the kernel's threads now:\n{dump[-12000:]}" if dump.strip() else ""

    def stderr_tail(self, chars: int = 3000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _check_alive(self, code: str) -> None:
        """Fail at once, saying how, when the kernel process has died (instead of waiting out the timeout)."""
        process = getattr(self.km.provisioner, "process", None)
        code_now = None if process is None else process.poll()
        if code_now is not None:
            error = KernelAborted if code_now == -6 else RuntimeError
            raise error(
                f"the kernel died (exit code {code_now}) while running {code[:200]!r}; "
                f"{self.fatal_lines()}its stderr ends:\n{self.stderr_tail()}"
            )

    def fatal_lines(self) -> str:
        """Why the kernel aborted, from its stderr and its tfmagic log (see :func:`why_it_died`)."""
        process = getattr(self.km.provisioner, "process", None)
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            text = ""
        return why_it_died(text + "\n" + kernel_log_of(getattr(process, "pid", None)))

    def _last_resort(self) -> None:
        """At the test process's exit: kill a kernel that a failed fixture never shut down (its
        tasks end with it: their control channel reaches end-of-file)."""
        if self.km.has_kernel:
            self.km.shutdown_kernel(now=True)

    def shutdown(self) -> None:
        atexit.unregister(self._last_resort)
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=False)
            self._stderr.close()
            self.stderr_path.unlink(missing_ok=True)
