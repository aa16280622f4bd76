"""Task processes on other hosts, reached with the user's own ``ssh``.

Each task is one ``ssh HOST exec python -u -m tfmagic.task_main`` whose
standard input and output are the task's control channel
(:mod:`tfmagic.protocol`), exactly as for a local task, and whose standard
error is the task's log, written to a file on *this* machine (so
``cluster.logs("worker:1")`` is one call away for remote tasks too).

Why the OpenSSH client and not a library: it is what the user's keys, agent,
``~/.ssh/config`` (aliases, ``ProxyJump``, ports) and known-hosts checks are
set up for.  ``BatchMode=yes`` makes a missing key fail at once instead of
waiting for a password prompt nobody can answer from a kernel.

No orphans on any host: the task is *tied* to its SSH session.  When the
owner goes away (``stop``, unload, ``kill -9`` of the kernel) the local
``ssh`` loses its standard input or dies, sshd closes the session, the task
reads end-of-file on its channel and ends itself and its process group (see
:mod:`tfmagic.task_main`).  A detached ``nohup`` launch would leave orphans.

Security: a TensorFlow server runs any graph anyone sends it.  By default each
remote task is kept (by the bind library, built on its own host) on the one
address its spec names, which other hosts must reach; anyone who can reach
that address can still use it.  ``tunnel=True`` keeps every server on its
host's loopback and carries all traffic through SSH tunnels via this
machine: only users of the hosts themselves can reach the servers then.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import threading
from collections.abc import Sequence

from ..errors import BadArgument, ClusterStartError, WaitTimedOut
from ..network import ports
from ..protocol import Op
from .base import TaskHandle
from .channel import TaskProcess
from .process import TASK_ENV, PopenLauncher, kill_tree, spawn

#: Options every connection gets; the user's own config still applies for the rest.
SSH_OPTIONS = (
    "-T",
    "-o",
    "BatchMode=yes",
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=3",
)


def resolve(destination: str, ssh: Sequence[str]) -> tuple[str, str]:
    """``(hostname, port)`` that ``ssh destination`` really reaches, per the user's config.

    ``ssh -G`` prints the configuration after aliases and ``Match`` blocks are
    applied, without connecting.
    """
    try:
        out = subprocess.run(
            [*ssh, "-G", destination], capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterStartError(f"could not run ssh to resolve {destination!r}: {exc}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ClusterStartError(f"ssh does not understand the host {destination!r}: {last}")
    found = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        found.setdefault(key.lower(), value.strip())
    hostname, port = found.get("hostname", destination), found.get("port", "22")
    proxied = any(found.get(k, "none").lower() != "none" for k in ("proxycommand", "proxyjump"))
    if not proxied:  # a name behind a jump host resolves there, not here
        try:
            socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            raise ClusterStartError(
                f"the host {destination!r} ({hostname}) does not resolve here ({why}); "
                "check the host names, or the ssh config that names them"
            ) from None
    return hostname, port


def check_hosts(hosts: Sequence[str], ssh_config: str | os.PathLike | None = None, ssh: str = "ssh") -> None:
    """Each host is one ``ssh`` understands and whose name resolves here (see :func:`resolve`);
    checked before a start shows progress or ``replace`` stops the running cluster."""
    exe = shutil.which(ssh)
    if exe is None:
        raise ClusterStartError(f"the ssh client ({ssh!r}) is not installed here; install openssh-client")
    for host in hosts:
        resolve(host, [exe, *(["-F", os.fspath(ssh_config)] if ssh_config else [])])


class SSHLauncher(PopenLauncher):
    """Starts task processes on SSH hosts; tasks are placed round-robin over ``hosts``.

    Parameters
    ----------
    hosts:
        SSH destinations as your ``ssh`` understands them (``node1``,
        ``user@10.0.0.2``, an alias from ``~/.ssh/config``).  The address in
        the cluster spec is the host name your config resolves it to, which
        the other hosts and this machine must be able to reach.
    python:
        The Python on the hosts that has TensorFlow and tfmagic installed.
    ssh_config:
        An ``ssh -F`` config file instead of ``~/.ssh/config``.
    ssh_options:
        More ``ssh`` arguments, e.g. ``["-i", "~/.ssh/lab_key"]``.
    env:
        Extra environment for every task.
    guard:
        Keep each server on its spec address only (built on each host; needs
        a C compiler there, else you are told).
    tunnel:
        Keep each server on its host's loopback and reach it through SSH
        tunnels via this machine (see the module docstring).

    >>> launcher = SSHLauncher(["node1", "node2"], python="/opt/venv/bin/python")  # doctest: +SKIP
    >>> cluster = tfmagic.Cluster(ps=1, workers=2, launcher=launcher)              # doctest: +SKIP
    """

    name = "ssh"

    def __init__(
        self,
        hosts: Sequence[str] | str,
        *,
        python: str = "python3",
        ssh_config: str | os.PathLike | None = None,
        ssh_options: Sequence[str] = (),
        env: dict[str, str | None] | None = None,
        guard: bool = True,
        tunnel: bool = False,
        ssh: str = "ssh",
    ) -> None:
        super().__init__()
        if isinstance(hosts, str):
            hosts = hosts.split(",")
        self.destinations = [h.strip() for h in hosts if h.strip()]
        if not self.destinations:
            raise BadArgument("give at least one SSH host, e.g. hosts=['node1', 'node2']")
        exe = shutil.which(ssh)
        if exe is None:
            raise ClusterStartError(f"the ssh client ({ssh!r}) is not installed here; install openssh-client")
        self.ssh = [exe, *(["-F", os.fspath(ssh_config)] if ssh_config else []), *ssh_options]
        self.python = python
        self.extra_env = dict(env or {})
        self.guard = guard
        self.tunnel = tunnel
        self.addresses: dict[str, str] = {}
        for dest in self.destinations:
            hostname, _port = resolve(dest, self.ssh)
            self.addresses[dest] = hostname
        self._dest_of: dict[int, str] = {}
        self._next = 0
        self._client_address: str | None = None
        self._tunnels: list[_Tunnel] = []
        if tunnel:
            mine = [d for d, a in self.addresses.items() if a.startswith("127.") or a in ("localhost", "::1")]
            if mine:
                raise ClusterStartError(
                    f"tunnel=True is for other hosts, and {mine[0]} is this machine's loopback; "
                    "drop --tunnel for it (its servers are on loopback already)"
                )

    # -- placement -------------------------------------------------------------
    @property
    def host(self) -> str:  # type: ignore[override]
        return self.addresses[self.destinations[0]]

    @property
    def signature(self) -> tuple:
        return (self.name, tuple(self.destinations), self.python, self.tunnel)

    def placement(self) -> tuple:
        return (self.name, tuple(self.destinations))

    def describe(self) -> str:
        return f" over ssh on {','.join(self.destinations)}"

    def hosts_for(self, count: int) -> list[str]:
        return [self.destinations[i % len(self.destinations)] for i in range(count)]

    def pick_port(self, proc: TaskHandle) -> int:
        """In tunnel mode a port must be free here (its local end) and on the task's host."""
        if not self.tunnel:
            return super().pick_port(proc)
        for _ in range(50):
            port = ports.free_port("127.0.0.1")
            if proc.request(Op.FREE_PORT, timeout=30.0, host="127.0.0.1", port=port)["port"] == port:
                return port
        raise WaitTimedOut(f"no port was free both here and on {proc.destination} after 50 tries")

    # -- tunnels (tunnel=True) --------------------------------------------------
    def prepare(self, cluster: dict[str, list[str]], procs: dict) -> None:
        """One SSH session per host carries the tunnels: ``-L`` for its own tasks (this
        machine reaches them), ``-R`` for every other host's tasks and for this client
        (its tasks reach them).  All traffic between hosts passes through this machine."""
        if not self.tunnel:
            return
        from .. import client

        self.close()
        client_port = client.client_port()
        self._client_address = f"127.0.0.1:{client_port}"
        where = {}
        for task, proc in procs.items():
            port = int(cluster[task.job][task.index].rsplit(":", 1)[1])
            where[port] = proc.destination
        for dest in sorted(set(where.values())):
            forwards = []
            for port, owner_dest in sorted(where.items()):
                flag = "-L" if owner_dest == dest else "-R"
                forwards += [flag, f"127.0.0.1:{port}:127.0.0.1:{port}"]
            forwards += ["-R", f"127.0.0.1:{client_port}:127.0.0.1:{client_port}"]
            self._tunnels.append(_Tunnel.open(self.ssh, dest, forwards))

    def close(self) -> None:
        tunnels, self._tunnels = self._tunnels, []
        for tunnel in tunnels:
            tunnel.kill()

    # -- processes ---------------------------------------------------------------
    def remote_command(self, address: str) -> str:
        """The shell command run on the host: exec, so the task *is* the session's process."""
        changes: dict[str, str | None] = dict(TASK_ENV)
        changes.update(self.extra_env)
        changes["TFMAGIC_PDEATHSIG"] = "1"  # the task dies with its SSH session, even while stopped
        if self.guard:
            changes["TFMAGIC_GUARD_HOST"] = "127.0.0.1" if self.tunnel else address
        unset = [f"-u {shlex.quote(k)}" for k, v in changes.items() if v is None]
        sets = [shlex.quote(f"{k}={v}") for k, v in changes.items() if v is not None]
        return " ".join(
            ["exec", "env", *unset, *sets, shlex.quote(self.python), "-u", "-m", "tfmagic.task_main"]
        )

    def spawn(self, log_path: str, host: str | None = None) -> TaskProcess:
        dest = host if host in self.addresses else None
        if dest is None:  # an address given back (a restart): find its destination
            dest = next((d for d, a in self.addresses.items() if a == host), None)
        if dest is None:
            with self._lock:
                dest = self.destinations[self._next % len(self.destinations)]
                self._next += 1
        address = self.addresses[dest]
        proc = self._start(
            [*self.ssh, *SSH_OPTIONS, dest, self.remote_command(address)],
            log_path,
            host="127.0.0.1" if self.tunnel else address,
            note=f"tfmagic: ssh {dest} ({address}): starting a task process\n",
        )
        with self._lock:
            self._dest_of[proc.pid] = dest
        proc.destination = dest
        return proc

    def _end(self, proc: TaskHandle, popen: subprocess.Popen) -> None:
        """Ask the task to end at once (it kills its own group), then end the session."""
        proc.send(Op.CRASH)
        try:
            popen.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass  # the task did not answer: closing the session ends it (end of its channel)
        if popen.poll() is None:
            kill_tree(popen.pid)

    def diagnose(self, proc: TaskProcess, log_tail: str) -> str:
        """What to do about a task that did not come up, from its exit code and log."""
        dest = self._dest_of.get(proc.pid, "the host")
        if "No module named tfmagic" in log_tail or "No module named 'tfmagic" in log_tail:
            return f"install tfmagic on {dest} for {self.python} (pip install tfmagic), or pass python=/its/python"
        if proc.exit_code == 127 or (
            self.python in log_tail and ("not found" in log_tail or "No such file" in log_tail)
        ):
            return (
                f"{self.python} is not on {dest}; pass python= (--python) with the Python that has TensorFlow"
            )
        if proc.exit_code == 255 or "Permission denied" in log_tail or "Host key verification" in log_tail:
            return f"check that `ssh {dest} true` works here without a password prompt (keys, agent, known_hosts)"
        return ""

    def client_address(self, defn) -> str | None:
        """This machine's address on the route to the hosts, and this process's client port."""
        if self._client_address is None:
            from .. import client

            local = ports.route_address(self.addresses[self.destinations[0]])
            self._client_address = f"{local}:{client.client_port()}"
        return self._client_address

    # -- security ------------------------------------------------------------------
    def security_note(self) -> str:
        hosts = ", ".join(self.destinations)
        if self.tunnel:
            return (
                f"task servers on {hosts} listen on each host's loopback only and are reached through "
                "SSH tunnels via this machine; anyone logged in on those hosts can still run graphs in them"
            )
        where = "their spec address only" if self.guard else "EVERY network interface"
        return (
            f"task servers on {hosts} listen on {where} and run any TensorFlow graph anyone who can "
            "reach them sends; on a network you do not trust, use tunnel=True (--tunnel)"
        )


class _Tunnel:
    """One ``ssh`` session holding port forwards, tied to its owner like a task.

    Its remote command prints a line once the forwards are up
    (``ExitOnForwardFailure`` makes ssh confirm them first) and then reads
    its standard input: when the owner goes away the pipe closes and the
    session, with its forwards, ends.
    """

    READY = "tfmagic-tunnel-ready"

    def __init__(self, popen: subprocess.Popen, dest: str) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.destination = dest

    @classmethod
    def open(cls, ssh: list[str], dest: str, forwards: list[str], timeout: float = 30.0) -> _Tunnel:
        from ..procs import owner

        popen = spawn(
            [
                *ssh,
                *SSH_OPTIONS,
                "-o",
                "ExitOnForwardFailure=yes",
                *forwards,
                dest,
                f"echo {cls.READY}; exec cat >/dev/null",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        tunnel = cls(popen, dest)
        owner.register(tunnel)
        line: list[bytes] = []
        reader = threading.Thread(target=lambda: line.append(popen.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or cls.READY.encode() not in line[0]:
            tunnel.kill()
            err = (popen.stderr.read() or b"").decode(errors="replace").strip().splitlines()
            raise ClusterStartError(
                f"the SSH tunnels to {dest} did not come up ({err[-1] if err else 'no answer'}); "
                "check that the host allows port forwarding (AllowTcpForwarding) or drop --tunnel"
            )
        return tunnel

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        from ..procs import owner

        if self.popen.poll() is None:
            kill_tree(self.popen.pid)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        owner.forget(self)
