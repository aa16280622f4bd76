"""Keep TensorFlow's native log lines out of the notebook, without losing them.

Why: TensorFlow's C++ runtime (absl logging, gRPC) writes straight to file
descriptor 2 of the client process, bypassing ``sys.stderr``.  ipykernel
forwards everything written to fd 2 into the notebook, so the person sees
lines such as::

    E0000 00:00:1795346555.334185    3116 add_port.cc:83] Failed to add port ...
    E0000 00:00:1795347984.831072    9942 context.cc:566] Unable to close remote context ...
    Additional GRPC error information from remote target /job:worker/replica:0/task:1 ...

and, when cluster servers stop under a connected client, whole floods of
``CloseContext`` errors.  ``TF_CPP_MIN_LOG_LEVEL`` is read once, when
TensorFlow is first imported, so it cannot quiet a kernel that already
imported it; the only lever left is fd 2 itself.

What: :func:`install` puts a pipe on fd 2 and a reader thread behind it.
The thread sorts the stream line by line:

- native log lines (``E0000 00:00:... file.cc:83] ...``, the older
  ``2026-11-22 11:20:00.123456: E tensorflow/...`` form, absl's
  ``WARNING: All log messages before absl::InitializeLog() ...``) and their
  continuation lines are appended to a log file, flushed at once;
- every other byte (prints, tracebacks, ``tf.print`` output, prompts) goes
  on, unchanged, to whatever fd 2 was before: the terminal, or ipykernel's
  own pipe and from there the notebook.  A line without its newline yet is
  passed on after :data:`FLUSH_DELAY` seconds, so prompts are not held back.

To see the native lines again, read the log file, or pass ``show=True``
(or set ``installed().show = True`` at any time): they are then written to
the log file *and* passed on.

Example::

    from tfmagic import logfilter
    filt = logfilter.install("/tmp/tfmagic/native.log")
    ...                      # use TensorFlow; native noise goes to the file
    filt.filtered_lines      # how many lines were kept out of sight
    logfilter.uninstall()    # fd 2 is what it was before

Limits: a process started while the filter is installed inherits the pipe as
its fd 2 (its native lines are filtered too); after :func:`uninstall` such a
process gets ``EPIPE`` on writing to stderr.  Start long-lived children with
their stderr redirected to a file, as the launchers do.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import re
import select
import stat
import sys
import threading
import time
from pathlib import Path

__all__ = [
    "CONTINUATION_WINDOW",
    "FLUSH_DELAY",
    "NativeLogFilter",
    "install",
    "installed",
    "is_native_log_line",
    "uninstall",
]

FLUSH_DELAY = 0.05
"""Seconds an unfinished line may wait for its newline before it is passed on."""

CONTINUATION_WINDOW = 0.25
"""Seconds after a native line during which a following line may continue it.

A native message with detail lines is written in one ``write()``, so its
continuation lines arrive together with it; the window keeps a user's own
indented print, made later, from ever being taken for one.
"""

_READ_SIZE = 65536
_DRAIN_SECONDS = 2.0  # most uninstall() spends passing on what is still in the pipe
_JOIN_SECONDS = 5.0

_NATIVE_HEADER = re.compile(
    r"""
      [IWEF]\d{4}\ \d\d:\d\d:\d+\.\d+\s+\d+\ [^\s\]]+:\d+\](?:\s|$)
        # absl / glog / gRPC: E0000 00:00:1795346555.334185    3116 add_port.cc:83] ...
    | \d{4}-\d\d-\d\d\ \d\d:\d\d:\d\d\.\d+:\ [IWEF]\ [^\s\]]+:\d+\](?:\s|$)
        # TensorFlow before absl: 2026-11-22 11:20:00.123456: E tensorflow/core/...cc:76] ...
    | WARNING:\ All\ log\ messages\ before\ absl::InitializeLog\(\)\ is\ called
    """,
    re.VERBOSE,
)

_CONTINUATION = re.compile(
    r"""
      [ \t]+\S                                   # indented detail
    | :\{                                        # gRPC status, old form  :{"created":"@16...
    | :[A-Z][A-Z_]*:                             # gRPC status, new form  :UNKNOWN:Error received from peer
    | \{\s*"?(?:created|created_time|grpc_status|grpc_message|description)"?\s*:
    | Additional\ GRPC\ error\ information
    | This\ could\ happen\ if\ the\ remote\ target\ has\ been\ disconnected  # context.cc, second line
    | To\ enable\ the\ following\ instructions:  # cpu_feature_guard.cc, second line
    | ===\ Source\ Location\ Trace:
    | (?:external|tensorflow|third_party|tsl|xla)/\S+:\d+   # source location trace entries
    """,
    re.VERBOSE,
)


def is_native_log_line(line: str, previous_was_native: bool) -> bool:
    """Whether ``line`` is TensorFlow/absl/gRPC native log output.

    ``previous_was_native`` says whether the line just before was one; only
    then can a line continue a native message (gRPC error details, an
    indented detail, the second line of the CPU-feature notice).  The rules
    are narrow on purpose: a user's line is never taken for a header, and
    only a few recognisable shapes count as continuations.

    >>> is_native_log_line("E0000 00:00:1795346555.334185    3116 add_port.cc:83] Failed", False)
    True
    >>> is_native_log_line("Traceback (most recent call last):", True)
    False
    """
    line = line.rstrip("\r\n")
    if _NATIVE_HEADER.match(line):
        return True
    return previous_was_native and _CONTINUATION.match(line) is not None


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class NativeLogFilter:
    """The reader behind fd 2 that sorts native log lines from everything else.

    Made by :func:`install`, which keeps one per process; use that rather
    than this class directly.

    Attributes read by the status display:

    - ``filtered_lines``: native lines recognised (always written to the log);
    - ``forwarded_bytes``: bytes passed on to the real stderr;
    - ``error``: the last error writing the log file or the reader met, if any.
    """

    def __init__(self, log_path: str | os.PathLike, *, show: bool = False):
        self._show = bool(show)
        self._log_path = Path(log_path)
        self._log = None
        self._faulthandler_was = False
        self._log_lock = threading.Lock()
        self.filtered_lines = 0
        self.forwarded_bytes = 0
        self.error: BaseException | None = None
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._read_fd = self._wake_r = self._wake_w = self._downstream = -1
        self._pipe_id: tuple[int, int] | None = None
        # Reader-thread state: bytes of an unfinished line, since when it
        # waits, the route already chosen for it (if a part was passed on),
        # and whether/when the last line was native.
        self._pending = b""
        self._pending_since = 0.0
        self._route: bool | None = None
        self._previous_native = False
        self._last_native = 0.0

    def __repr__(self) -> str:
        state = "active" if self.active else "stopped"
        return (
            f"<NativeLogFilter {state} log={str(self._log_path)!r} show={self._show} "
            f"filtered_lines={self.filtered_lines} forwarded_bytes={self.forwarded_bytes}>"
        )

    @property
    def show(self) -> bool:
        """Also pass native lines on to stderr (they are always logged)."""
        return self._show

    @show.setter
    def show(self, value: bool) -> None:
        self._show = bool(value)

    @property
    def log_path(self) -> Path:
        """The file native lines are appended to."""
        return self._log_path

    @property
    def active(self) -> bool:
        """The reader runs and fd 2 is still its pipe (nobody replaced it since)."""
        return (
            self._thread is not None
            and self._thread.is_alive()
            and os.getpid() == self._pid
            and self._owns_fd2()
        )

    # -- lifecycle (called by install / uninstall) ---------------------------

    def _start(self) -> None:
        self._open_log(self._log_path)  # fails here, before fd 2 is touched
        write_fd = -1
        try:
            self._read_fd, write_fd = os.pipe()
            self._wake_r, self._wake_w = os.pipe()
            self._downstream = os.dup(2)
        except OSError:
            for fd in (write_fd, self._read_fd, self._wake_r, self._wake_w, self._downstream):
                if fd >= 0:
                    os.close(fd)
            self._read_fd = self._wake_r = self._wake_w = self._downstream = -1
            self._log.close()
            raise
        st = os.fstat(self._read_fd)
        self._pipe_id = (st.st_dev, st.st_ino)
        _flush_sys_stderr()
        os.dup2(write_fd, 2)
        os.close(write_fd)  # fd 2 is now the only write end we hold
        self._faulthandler_was = faulthandler.is_enabled()
        self._point_faulthandler()
        self._thread = threading.Thread(target=self._run, name="tfmagic-native-log-filter", daemon=True)
        self._thread.start()

    def _stop(self) -> None:
        if os.getpid() != self._pid:  # a forked child: the parent's reader owns all this
            return
        _flush_sys_stderr()
        self._restore_fd2()
        if self._thread is not None and self._thread.is_alive():
            _write_all(self._wake_w, b"x")
            self._thread.join(_JOIN_SECONDS)
            if self._thread.is_alive():
                # Stuck writing to a full downstream; closing its fds under it
                # could hand them to someone else. Leave them to the process.
                return
        for fd in (self._read_fd, self._wake_r, self._wake_w, self._downstream):
            if fd >= 0:
                os.close(fd)
        self._read_fd = self._wake_r = self._wake_w = self._downstream = -1
        with self._log_lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    def _set_log_path(self, log_path: str | os.PathLike) -> None:
        if Path(log_path) != self._log_path:
            self._open_log(Path(log_path))

    def _open_log(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        new = open(path, "ab")  # noqa: SIM115 - kept open for the filter's lifetime
        with self._log_lock:
            old, self._log, self._log_path = self._log, new, path
            if self._read_fd >= 0:
                self._point_faulthandler()
        if old is not None:
            old.close()

    def _point_faulthandler(self) -> None:
        """A process that dies of a fatal signal (TensorFlow's ``abort()`` after a failed check, a
        segfault) writes its Python stacks into the log file, from the dying thread itself.

        Into fd 2 they would land in the pipe whose reader dies with the process, and in a kernel
        what fd 2 was before is ipykernel's own pipe, lost the same way: measured, a kernel that
        aborted inside TensorFlow left no line anywhere. The file survives it (``%tf_cluster logs
        kernel``, and the tests quote it when a kernel dies)."""
        faulthandler.enable(file=self._log.fileno(), all_threads=True)

    def _owns_fd2(self) -> bool:
        try:
            st = os.fstat(2)
        except OSError:
            return False
        return stat.S_ISFIFO(st.st_mode) and (st.st_dev, st.st_ino) == self._pipe_id

    def _restore_fd2(self) -> None:
        if self._downstream >= 0 and self._owns_fd2():
            os.dup2(self._downstream, 2)
        self._release_faulthandler()

    def _release_faulthandler(self) -> None:
        """Fatal stacks go where they went before the filter (the log file is about to close)."""
        if self._faulthandler_was:
            faulthandler.enable(file=2, all_threads=True)
        else:
            faulthandler.disable()

    # -- the reader thread ---------------------------------------------------

    def _run(self) -> None:
        try:
            self._pump()
        except Exception as exc:  # noqa: BLE001 - never leave fd 2 a pipe that nobody reads
            self.error = exc
            self._restore_fd2()
            if self._pending:
                _write_all(self._downstream, self._pending)
                self._pending = b""

    def _pump(self) -> None:
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        drain_until = None  # set once uninstall() asked us to finish
        while True:
            if drain_until is not None:
                timeout_ms = 0
            elif self._pending:
                wait = self._pending_since + FLUSH_DELAY - time.monotonic()
                timeout_ms = max(0, int(wait * 1000) + 1)
            else:
                timeout_ms = None
            events = dict(poller.poll(timeout_ms))
            if self._wake_r in events and drain_until is None:
                os.read(self._wake_r, 64)
                poller.unregister(self._wake_r)
                drain_until = time.monotonic() + _DRAIN_SECONDS
            eof = False
            if self._read_fd in events:
                chunk = os.read(self._read_fd, _READ_SIZE)
                if chunk:
                    self._feed(chunk, time.monotonic())
                else:
                    eof = True
            drained = drain_until is not None and (
                self._read_fd not in events or time.monotonic() > drain_until
            )
            if eof or drained:
                self._flush_partial(time.monotonic())
                return
            if self._pending and time.monotonic() - self._pending_since >= FLUSH_DELAY:
                self._flush_partial(time.monotonic())

    def _feed(self, chunk: bytes, now: float) -> None:
        if not self._pending:
            self._pending_since = now
        data = self._pending + chunk
        cut = data.rfind(b"\n") + 1
        self._pending = data[cut:]
        if cut:
            self._pending_since = now
        to_log = bytearray()
        to_forward = bytearray()
        for line in _lines(data[:cut]):
            if self._route is not None:  # the rest of a line already partly passed on
                native, self._route = self._route, None
            else:
                native = self._classify(line, now)
            self._sort(line, native, now, to_log, to_forward)
        if self._pending and self._route is not None:
            self._sort(self._pending, self._route, now, to_log, to_forward)
            self._pending = b""
        self._emit(to_log, to_forward)

    def _flush_partial(self, now: float) -> None:
        if not self._pending:
            return
        if self._route is None:
            self._route = self._classify(self._pending, now)
        to_log = bytearray()
        to_forward = bytearray()
        self._sort(self._pending, self._route, now, to_log, to_forward)
        self._pending = b""
        self._emit(to_log, to_forward)

    def _classify(self, data: bytes, now: float) -> bool:
        previous = self._previous_native and now - self._last_native <= CONTINUATION_WINDOW
        native = is_native_log_line(_decode(data), previous)
        if native:
            self.filtered_lines += 1
        return native

    def _sort(self, data: bytes, native: bool, now: float, to_log: bytearray, to_forward: bytearray) -> None:
        self._previous_native = native
        if native:
            self._last_native = now
            to_log += data
            if self._show:
                to_forward += data
        else:
            to_forward += data

    def _emit(self, to_log: bytearray, to_forward: bytearray) -> None:
        if to_log:
            with self._log_lock:
                try:
                    self._log.write(to_log)
                    self._log.flush()
                except (OSError, ValueError) as exc:  # disk full, closed by a retarget race
                    self.error = exc
        if to_forward and _write_all(self._downstream, to_forward):
            self.forwarded_bytes += len(to_forward)


def _lines(data: bytes) -> list[bytes]:
    """``data`` (ending in a newline) cut after each ``\\n``; a ``\\r`` does not end a line."""
    return [part + b"\n" for part in data.split(b"\n")[:-1]]


def _write_all(fd: int, data: bytes | bytearray) -> bool:
    """Write everything or give up quietly when nobody reads any more."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:  # a non-blocking terminal or pipe that is full
            waiter = select.poll()
            waiter.register(fd, select.POLLOUT)
            waiter.poll(1000)
            continue
        except OSError:  # EPIPE, EBADF: there is no one left to tell
            return False
        view = view[written:]
    return True


def _flush_sys_stderr() -> None:
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


_lock = threading.Lock()
_instance: NativeLogFilter | None = None
_atexit_registered = False


def install(log_path: str | os.PathLike, *, show: bool = False) -> NativeLogFilter:
    """Filter native log lines out of fd 2 of this process into ``log_path``.

    Safe to call again: the running filter is kept, pointed at ``log_path``
    and set to ``show``.  Returns the process-wide :class:`NativeLogFilter`.
    """
    global _instance, _atexit_registered
    with _lock:
        if _instance is not None and _instance.active:
            _instance._set_log_path(log_path)
            _instance.show = show
            return _instance
        if _instance is not None:  # its fd 2 was replaced or its reader ended
            _instance._stop()
        filt = NativeLogFilter(log_path, show=show)
        filt._start()
        _instance = filt
        if not _atexit_registered:
            # Pass on what is still in the pipe (a script's last traceback).
            atexit.register(uninstall)
            _atexit_registered = True
        return filt


def uninstall() -> None:
    """Give fd 2 back as it was and stop the reader; nothing if not installed."""
    global _instance
    with _lock:
        filt, _instance = _instance, None
        if filt is not None:
            filt._stop()


def installed() -> NativeLogFilter | None:
    """The process-wide filter, or ``None`` when none is installed."""
    return _instance


def _forget_in_child() -> None:
    # The reader thread stays in the parent, which keeps filtering what this
    # child writes to the inherited fd 2; the child starts with a clean slate.
    global _instance, _lock
    _instance = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
