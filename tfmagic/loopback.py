"""Keep task servers reachable from one address only (loopback for local clusters).

Why: every ``tf.distribute.Server`` binds ``0.0.0.0:<port>`` (hard-coded in
TensorFlow's ``grpc_server_lib.cc``; there is no bind-address option), gRPC
turns that into a listener on every interface, and the server runs any graph
it is sent, with no authentication.  On a laptop on café Wi-Fi that is a
remote-code-execution port per task.

What this closes: task processes are started with a tiny ``LD_PRELOAD``
library (``_native/bindhost.c``) that rewrites wildcard ``bind()`` calls to
``TFMAGIC_BIND_HOST`` (127.0.0.1 here), so the servers listen on loopback
only.  The library is compiled on first use with the machine's C compiler
and cached.

What it cannot close: the notebook kernel's own client-side TF server (it
starts inside the already-running kernel, after the connection), and other
users of the same machine, who reach loopback too (shared hosts, JupyterHub).
Those are told to the user, not hidden.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).parent / "_native" / "bindhost.c"


@dataclass(frozen=True)
class BindGuard:
    """Whether task servers can be kept on ``host``, and the env that does it."""

    available: bool
    env: dict[str, str] = field(default_factory=dict)
    library: str | None = None
    reason: str = ""


def cache_dir() -> Path:
    base = os.environ.get("TFMAGIC_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "tfmagic" if xdg else Path.home() / ".cache" / "tfmagic"


def library_key(source_text: str) -> str:
    """A name for the compiled library that changes with its source and the machine."""
    h = hashlib.sha256()
    h.update(source_text.encode())
    h.update(f"{platform.system()}-{platform.machine()}-{platform.libc_ver()}".encode())
    return f"bindhost-{h.hexdigest()[:16]}.so"


def _compiler() -> str | None:
    for cand in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


@functools.lru_cache(maxsize=1)
def _build() -> tuple[str | None, str]:
    """Compile the library once per machine; returns (path, reason-if-not)."""
    if platform.system() != "Linux":
        return None, f"keeping servers on loopback needs Linux (this is {platform.system()})"
    try:
        text = SOURCE.read_text()
    except OSError as exc:
        return None, f"the bind library's source is missing ({exc}); reinstall tfmagic"
    target = cache_dir() / library_key(text)
    if target.exists():
        return str(target), ""
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (cc) was found; install gcc to keep task servers on loopback"
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".bindhost-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run(
            [cc, "-shared", "-fPIC", "-O2", "-o", tmp, str(SOURCE), "-ldl"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
            return None, f"compiling the bind library failed ({last}); task servers listen on every interface"
        os.replace(tmp, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"compiling the bind library failed ({exc}); task servers listen on every interface"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return str(target), ""


def bind_guard(host: str = "127.0.0.1", base_env: dict[str, str] | None = None) -> BindGuard:
    """The environment that keeps a task's servers on ``host`` (an IPv4 literal)."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return BindGuard(False, reason=f"{host!r} is not an IPv4 address; servers listen on every interface")
    library, reason = _build()
    if library is None:
        return BindGuard(False, reason=reason)
    existing = (base_env if base_env is not None else os.environ).get("LD_PRELOAD", "")
    preload = library if not existing else f"{library}:{existing}"
    return BindGuard(True, env={"LD_PRELOAD": preload, "TFMAGIC_BIND_HOST": host}, library=library)
