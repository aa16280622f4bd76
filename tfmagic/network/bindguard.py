"""Keep task servers reachable from one address only (loopback for local clusters).

Why: every ``tf.distribute.Server`` binds ``0.0.0.0:<port>`` (hard-coded in
TensorFlow's ``grpc_server_lib.cc``; ``ServerDef`` has no bind-address field),
gRPC turns that into a dual-stack ``[::]`` listener on every interface, and the
server runs any graph it is sent, with no authentication.  On a laptop on café
Wi-Fi that is a remote-code-execution port per task.

What this closes: task processes are started with a tiny ``LD_PRELOAD``
library (``_native/bindhost.c``) that rewrites wildcard ``bind()`` calls to
``TFMAGIC_BIND_HOST``: ``0.0.0.0`` becomes ``127.0.0.1`` and ``[::]`` becomes
the IPv4-mapped ``::ffff:127.0.0.1`` (not ``::1``, which clients resolving
``localhost`` to 127.0.0.1 could not reach).  The servers then listen on
loopback only.  The library is compiled on first use with the machine's C
compiler and cached per user.

The cache is trusted only when nobody else could have put a file there: the
directory and the library must be this user's, not symlinks, and writable by
nobody else, and the directory's parents must not let others replace it.
Otherwise (a shared or world-writable ``TFMAGIC_CACHE_DIR``, say) a planted
``bindhost-<key>.so`` would run inside every task, so the library is built
into a private directory of this process instead (removed at exit); the
guard works the same, only the first start of each process pays the compile.

The notebook kernel's own client-side TF server starts inside the
already-running kernel process, where no preload can reach: for it,
:func:`guard_this_process` points the ``bind()`` entries of TensorFlow's
loaded libraries at the same rewrite (see :mod:`tfmagic.network.clientserver`).
Other users of the same machine reach loopback too (shared hosts, JupyterHub):
the same library (``TFMAGIC_OWN_PEERS=1``, and :func:`own_peers_this_process`
in the kernel) closes every loopback connection whose socket the kernel's socket
table gives to another user, before gRPC sees it.  What it cannot close: the
user's own processes (any of them can send a graph), and root.  It needs Linux and a C compiler; without them
:func:`bind_guard` says why in one sentence instead of failing.

Example::

    guard = bind_guard("127.0.0.1", base_env=os.environ)
    if guard.available:
        env = {**os.environ, **guard.env}   # LD_PRELOAD + TFMAGIC_BIND_HOST
    else:
        print(guard.reason)
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import ipaddress
import os
import platform
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).parents[1] / "_native" / "bindhost.c"
#: The library's sources: the bind guard, and the serving threads of TensorFlow's worker service
#: (``_native/servethreads.c``: a task's server holds about 41 MB with TensorFlow's 8, 7.7 with one),
#: which rides in the same preload because every task gets this one already.
SOURCES = (SOURCE, SOURCE.with_name("servethreads.c"))

#: Compiler flags; part of the cache key, so changing them rebuilds.
CFLAGS = ("-shared", "-fPIC", "-O2", "-pthread")
LIBS = ("-ldl",)
COMPILE_TIMEOUT = 60.0

_UNGUARDED = "so task servers listen on every interface"


@dataclass(frozen=True)
class BindGuard:
    """Whether task servers can be kept on one host, and the environment that does it.

    ``env`` holds the variables to add to a task's environment (empty when not
    ``available``); ``reason`` says, in one sentence, why not and what to do.
    """

    available: bool
    env: dict[str, str] = field(default_factory=dict)
    library: str | None = None
    reason: str = ""


def cache_dir() -> Path:
    """Where the compiled library lives: ``$TFMAGIC_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/tfmagic``, else ``~/.cache/tfmagic``."""
    base = os.environ.get("TFMAGIC_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "tfmagic" if xdg else Path.home() / ".cache" / "tfmagic"


def source_text() -> str:
    """The library's sources, as its cache key reads them."""
    return "".join(path.read_text() for path in SOURCES)


def library_key(source_text: str) -> str:
    """The library's file name: changes with its source, the flags and the machine."""
    h = hashlib.sha256()
    h.update(source_text.encode())
    h.update(" ".join(CFLAGS + LIBS).encode())
    libc = "-".join(platform.libc_ver())
    h.update(f"{platform.system()}-{platform.machine()}-{libc}".encode())
    return f"bindhost-{h.hexdigest()[:16]}.so"


def _compiler() -> list[str] | None:
    """The C compiler command ($CC may carry arguments, e.g. ``ccache gcc``)."""
    candidates = []
    if os.environ.get("CC"):
        candidates.append(shlex.split(os.environ["CC"]))
    candidates += [["cc"], ["gcc"], ["clang"]]
    for cmd in candidates:
        if cmd and shutil.which(cmd[0]):
            return [shutil.which(cmd[0]), *cmd[1:]]
    return None


def _safe_from_others(st: os.stat_result, uid: int) -> bool:
    """Owned by ``uid`` and writable by nobody else."""
    return st.st_uid == uid and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _parents_safe(directory: Path, uid: int) -> bool:
    """No other user can rename or replace ``directory`` through one of its parents.

    Each real parent (symlinks resolved: whoever may change a link may change
    its own parent too) must belong to root or to us, and be writable by
    nobody else unless it has the sticky bit (``/tmp``), which keeps others
    from renaming what is ours.
    """
    current = Path(os.path.realpath(directory.parent))
    while True:
        try:
            st = os.lstat(current)
        except OSError:
            return False
        if st.st_uid not in (0, uid):
            return False
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return False
        if current.parent == current:
            return True
        current = current.parent


def trusted_dir(directory: Path, create: bool = False) -> bool:
    """Whether a library found in ``directory`` can only have been put there by us.

    Not followed if it is a symlink (that is not trusted); made with mode
    0700, parents too, when ``create`` and it does not exist yet.
    """
    uid = os.geteuid()
    if create and not os.path.lexists(directory):
        missing = []
        current = directory
        while not os.path.lexists(current) and current.parent != current:
            missing.append(current)
            current = current.parent
        try:
            for path in reversed(missing):
                os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return False
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and _safe_from_others(st, uid) and _parents_safe(directory, uid)


def trusted_file(path: Path) -> bool:
    """A regular file (not a symlink) of ours that nobody else may write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and _safe_from_others(st, os.geteuid())


_private: Path | None = None
_private_lock = threading.Lock()


def private_dir() -> Path:
    """This process's own build directory (mode 0700, made once, removed at exit)."""
    global _private
    with _private_lock:
        if _private is None or not _private.is_dir():
            _private = Path(tempfile.mkdtemp(prefix="tfmagic-bindhost-"))
            atexit.register(shutil.rmtree, str(_private), True)
        return _private


def built_privately(library: str | None) -> bool:
    """Whether ``library`` lives in this process's :func:`private_dir` (gone when it exits)."""
    return bool(library) and _private is not None and Path(library).parent == _private


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


@functools.lru_cache(maxsize=8)
def _build(directory: str) -> tuple[str | None, str]:
    """Compile the library into ``directory`` once; returns (path, reason-if-not).

    A ``directory`` that others could write to (see :func:`trusted_dir`) is
    not used at all: the library goes to :func:`private_dir` instead.
    """
    if platform.system() != "Linux":
        return (
            None,
            f"keeping task servers on loopback needs Linux (this is {platform.system()}), {_UNGUARDED}",
        )
    try:
        text = source_text()
    except OSError as exc:
        return None, f"the bind library's source is missing ({exc}), {_UNGUARDED}; reinstall tfmagic"
    where = Path(directory)
    if not trusted_dir(where, create=True):
        where = private_dir()
    target = where / library_key(text)
    if any(c in str(target) for c in " \t\n:"):
        # ld.so splits LD_PRELOAD on spaces and colons: such a path would be
        # ignored with a warning while we claimed the servers were guarded.
        return None, (
            f"the cache path {str(target)!r} contains a space or colon, which LD_PRELOAD cannot carry, "
            f"{_UNGUARDED}; set TFMAGIC_CACHE_DIR to a plain path"
        )
    if trusted_file(target):
        return str(target), ""
    cc = _compiler()
    if cc is None:
        return None, f"no C compiler (cc) was found, {_UNGUARDED}; install gcc to keep them on loopback"
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".bindhost-", suffix=".so", dir=target.parent)
        os.close(fd)
        proc = subprocess.run(
            [*cc, *CFLAGS, "-o", tmp, *map(str, SOURCES), *LIBS],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT,
        )
        if proc.returncode != 0:
            return None, (
                f"compiling the bind library failed ({_last_line(proc.stderr)}), {_UNGUARDED}; "
                "check the C compiler or set CC"
            )
        os.chmod(tmp, 0o755)  # in a directory only we can write: nobody can swap it meanwhile
        if not trusted_file(Path(tmp)):
            raise OSError(f"the compiled library {tmp} is not a private file of ours")
        os.replace(tmp, target)  # replaces a symlink or someone else's file there, never writes through it
        tmp = None
    except subprocess.TimeoutExpired:
        return None, f"compiling the bind library took over {COMPILE_TIMEOUT:g} s, {_UNGUARDED}; check $CC"
    except OSError as exc:
        return None, (
            f"building the bind library in {target.parent} failed ({exc}), {_UNGUARDED}; "
            "set TFMAGIC_CACHE_DIR to a writable directory"
        )
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return str(target), ""


def bind_guard(host: str = "127.0.0.1", base_env: Mapping[str, str] | None = None) -> BindGuard:
    """The environment that keeps a task's servers on ``host`` (an IPv4 literal).

    ``LD_PRELOAD`` in the result is the library followed by the one already in
    ``base_env`` (default: this process's environment), which the child would
    otherwise lose.
    """
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        return BindGuard(
            False, reason=f"{host!r} is not an IPv4 address, {_UNGUARDED}; give one such as 127.0.0.1"
        )
    if address.is_unspecified:
        return BindGuard(
            False, reason=f"{host} means every interface, {_UNGUARDED}; give one such as 127.0.0.1"
        )
    library, reason = _build(str(cache_dir()))
    if library is None:
        return BindGuard(False, reason=reason)
    existing = (base_env if base_env is not None else os.environ).get("LD_PRELOAD", "")
    others = [p for p in existing.replace(" ", ":").split(":") if p and p != library]
    preload = ":".join([library, *others])
    env = {"LD_PRELOAD": preload, "TFMAGIC_BIND_HOST": str(address)}
    if peers_checkable():
        env["TFMAGIC_OWN_PEERS"] = "1"
    return BindGuard(True, env=env, library=library)


def _loaded(library: str, name: str, *argtypes):
    """The bind library's function ``name``, loaded into this process and typed to return an int
    (OSError or AttributeError when it cannot be: a library that does not load, an old build)."""
    import ctypes

    fn = getattr(ctypes.CDLL(library), name)
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


def _patched_entries(name: str, argtypes: tuple, *args) -> int:
    """Call the bind library's ``name`` (one that points entries of this process's loaded libraries at
    a wrapper) with ``args``; how many entries it changed, 0 when the library is not available here."""
    guard = bind_guard()
    if not guard.available:
        return 0
    try:
        fn = _loaded(guard.library, name, *argtypes)
    except (OSError, AttributeError):
        return 0
    return max(0, fn(*args))


def guard_this_process(host: str = "127.0.0.1", match: str = "/tensorflow/") -> tuple[int, str]:
    """Rewrite wildcard binds of the libraries already loaded in this process whose path contains
    ``match`` (TensorFlow's own) to ``host``; returns (entries changed, reason when none).

    For a process that cannot be preloaded because it is already running (the notebook kernel):
    the bind library's ``tfmagic_guard_loaded`` points those libraries' ``bind()`` entries at its
    rewrite.  Every other library of the process keeps libc's ``bind``.  Import TensorFlow first.
    """
    import ctypes

    mine = "so this process's TensorFlow server listens on every interface"
    guard = bind_guard(host)
    if not guard.available:
        return 0, guard.reason.replace(_UNGUARDED, mine)
    try:
        fn = _loaded(guard.library, "tfmagic_guard_loaded", ctypes.c_char_p, ctypes.c_char_p)
    except (OSError, AttributeError) as exc:
        return 0, f"loading the bind library into this process failed ({exc}), {mine}"
    changed = fn(host.encode(), match.encode())
    if changed <= 0:
        return 0, f"no library under {match!r} is loaded with a bind() entry tfmagic can change, {mine}"
    return changed, ""


def peers_checkable() -> bool:
    """Whether this machine's socket table says who owns a connection's other end (the peer check
    reads ``/proc/net/tcp``; a sandbox may hide it, and then nothing is claimed)."""
    return os.access("/proc/net/tcp", os.R_OK)


def own_peers_this_process(match: str = "/tensorflow/") -> int:
    """Let only this user's processes (and root's) connect from loopback to the servers of the
    libraries under ``match``; returns how many ``accept`` entries now check (0: none could).

    The running process's counterpart of ``TFMAGIC_OWN_PEERS=1`` (see ``_native/bindhost.c``):
    without it any user of a shared machine could send graphs to this process's TensorFlow server.
    """
    import ctypes

    if not peers_checkable():
        return 0
    return _patched_entries("tfmagic_own_peers_loaded", (ctypes.c_char_p,), match.encode())


def dead_peer_this_process(seconds: float, match: str = "/tensorflow/") -> int:
    """TCP connections the libraries under ``match`` open from now on give up on a peer that stops
    answering after ``seconds`` (0: TCP's own, about 15 minutes); returns how many ``connect``
    entries now do (0: none could).

    Why: a node that dies without a word (power, a cut link, a Slurm node failure) leaves
    TensorFlow's call to it waiting until TCP gives up, and the notebook kernel cannot connect to
    another cluster until then.  The library's ``connect`` wrapper sets ``TCP_USER_TIMEOUT`` and
    keepalive probes on each new connection; a peer whose machine still answers (a stopped or busy
    process) keeps it, unless it stays stopped while more than its receive buffer waits for it (Linux
    then counts the closed window as silence too).
    """
    import ctypes

    ms = max(0, round(seconds * 1000))
    return _patched_entries("tfmagic_dead_peer_loaded", (ctypes.c_char_p, ctypes.c_uint), match.encode(), ms)


def serving_threads_this_process(threads: int, match: str = "/tensorflow/") -> int:
    """TensorFlow servers this process starts from now on serve with ``threads`` threads (see
    ``_native/servethreads.c``); returns how many entries of the libraries under ``match`` now
    point at the library's wrapper (0: none could, and servers keep TensorFlow's 8).

    The running process's counterpart of ``TFMAGIC_SERVING_THREADS`` in a task's environment: the
    notebook kernel's own server (it becomes one on its first connection) then holds about 33 MB less.
    """
    import ctypes

    return _patched_entries(
        "tfmagic_serving_threads_loaded", (ctypes.c_char_p, ctypes.c_int), match.encode(), int(threads)
    )
