"""A real Slurm on this machine for the tests: munged, slurmctld and slurmd, private to one run.

Debian's packages (``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``; ``.ci/run`` installs them)
run here as root from a folder of their own: their own munge key and socket, their own ports,
state and spool, and a ``slurm.conf`` the client commands find through ``SLURM_CONF`` (set in this
process's environment while the Slurm runs, so kernels and tfmagic's own calls find it too).  One
node (this machine, by its host name) in one partition ``debug``; the node says it has
:data:`CPUS` cores (``SlurmdParameters=config_overrides``) so that a ps and a few workers fit on two
real ones, as tasks share cores on a laptop.  Nothing here is mocked: ``sbatch`` queues, slurmd
starts the job's step, ``scancel`` kills it.

``PrivateSlurm(root, nodes=2)`` makes a cluster of several nodes instead: each node a network
namespace of its own on a private bridge (``NODE_SUBNET.(10+i)``, this machine ``NODE_SUBNET.1``)
with its own host name (``n0``, ``n1``: a UTS namespace), running its own ``slurmd``; they share
this machine's files, as nodes share a home on a real cluster.  A node can die
(:meth:`PrivateSlurm.kill_node`): its link goes down and everything it ran is killed, so nothing it
had open says goodbye, and Slurm notices it no longer answers after ``SlurmdTimeout``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tfmagic.network.ports import free_port

CPUS = 8
DAEMONS = ("munged", "slurmctld", "slurmd")
#: the bridge of the multi-node Slurm's namespaces (the SSH tests' hosts use another /24)
NODE_SUBNET = "10.243.8"
#: seconds after which Slurm holds a silent node down (its minimum useful value: it pings a third as often)
NODE_TIMEOUT = 6


def skip_reason() -> str | None:
    """Why a private Slurm cannot run here, or None."""
    if os.geteuid() != 0:
        return "a private Slurm needs root (slurmd starts jobs as their users)"
    missing = [d for d in DAEMONS if not (shutil.which(d) or os.path.exists(f"/usr/sbin/{d}"))]
    missing += [c for c in ("sbatch", "squeue", "scancel", "sinfo") if shutil.which(c) is None]
    if missing:
        return f"needs Slurm and munge ({', '.join(missing)} missing): apt-get install slurmctld slurmd slurm-client munge"
    return None


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def netns_skip_reason() -> str | None:
    """Why a Slurm of several namespace nodes cannot run here, or None."""
    missing = [c for c in ("ip", "nsenter", "unshare") if shutil.which(c) is None]
    if missing:
        return f"a Slurm of several nodes needs {', '.join(missing)} (util-linux, iproute2)"
    return skip_reason()


class PrivateSlurm:
    """One running Slurm: ``conf`` (its slurm.conf), ``env`` (``SLURM_CONF``), ``queue()``, ``close()``.

    ``nodes``: ``None`` for one node, this machine; a count for that many nodes in network
    namespaces (``self.nodes``: name to address; ``self.address``: this machine's on their bridge).
    """

    def __init__(self, root: Path, nodes: int | None = None) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.namespaces: list[str] = []
        self.links: list[str] = []
        self.nodes: dict[str, str] = {}
        self.node_procs: dict[str, subprocess.Popen] = {}
        for sub in ("state", "spool", "log"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        self.socket = root / "munge.sock"
        self.conf = root / "slurm.conf"
        self.node = socket.gethostname()
        self.address = "127.0.0.1"
        if nodes:
            self.address = f"{NODE_SUBNET}.1"
            self.nodes = {f"n{i}": f"{NODE_SUBNET}.{10 + i}" for i in range(nodes)}
        node_lines = (
            [
                f"NodeName={name} NodeAddr={addr} NodeHostname={name} CPUs={CPUS} Sockets=1 "
                f"CoresPerSocket={CPUS} ThreadsPerCore=1 RealMemory=8000 State=UNKNOWN"
                for name, addr in self.nodes.items()
            ]
            if nodes
            else [
                f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={CPUS} Sockets=1 CoresPerSocket={CPUS} "
                "ThreadsPerCore=1 RealMemory=16000 State=UNKNOWN"
            ]
        )
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=tfmagic-tests",
                    f"SlurmctldHost={self.node}({self.address})",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.socket}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={root / 'state'}",
                    f"SlurmdSpoolDir={root / 'spool'}/%n",
                    f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={root / 'slurmd'}-%n.pid",
                    f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={root / 'log' / 'slurmd'}-%n.log",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SwitchType=switch/none",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SchedulerType=sched/backfill",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "SlurmdParameters=config_overrides",
                    "JobCompType=jobcomp/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "InactiveLimit=0",
                    "KillWait=2",
                    "MinJobAge=2",
                    f"SlurmdTimeout={NODE_TIMEOUT}",
                    *node_lines,
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
                    "",
                ]
            )
        )
        self.env = {"SLURM_CONF": str(self.conf)}
        try:
            self._start(
                [
                    _daemon("munged"),
                    "-F",
                    f"--socket={self.socket}",
                    f"--key-file={key}",
                    f"--pid-file={root / 'munged.pid'}",
                    f"--log-file={root / 'log' / 'munged.log'}",
                    f"--seed-file={root / 'munge.seed'}",
                    "--force",
                ]
            )
            self._wait(lambda: self.socket.exists(), "munged's socket")
            if nodes:
                self._bridge()
            self._start([_daemon("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            if nodes:
                for i, name in enumerate(self.nodes):
                    self.node_procs[name] = self._start(
                        self._in_node(i, name, [_daemon("slurmd"), "-D", "-N", name])
                    )
            else:
                self._start([_daemon("slurmd"), "-D", "-f", str(self.conf)])
            self._wait(self._idle, "the Slurm node(s) to be idle (sinfo)", timeout=60)
        except BaseException:
            self.close()
            raise

    def _start(self, cmd: list[str]) -> subprocess.Popen:
        name = Path(cmd[0]).name if cmd[0] != "nsenter" else f"slurmd-{cmd[-1]}"
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - the daemon's
        env = {**os.environ, **self.env}
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
        log.close()
        self.procs.append(proc)
        return proc

    # -- several nodes: network namespaces on a bridge ------------------------------------------
    def _tag(self) -> str:
        return f"{os.getpid() % 100000}s"

    def _bridge(self) -> None:
        from .sshhosts import _namespace, _run

        if NODE_SUBNET + "." in _run("ip", "-4", "addr").stdout:
            raise RuntimeError(f"{NODE_SUBNET}.0/24 is already in use on this host")
        bridge = f"tfmbr{self._tag()}"
        _run("ip", "link", "add", bridge, "type", "bridge")
        self.links.append(bridge)
        _run("ip", "addr", "add", f"{self.address}/24", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        tag = self._tag()
        for i, addr in enumerate(self.nodes.values()):
            _namespace(self, bridge, f"{tag}-{i}", f"{tag}h{i}", f"{tag}n{i}", addr)

    def _in_node(self, index: int, name: str, cmd: list[str]) -> list[str]:
        """``cmd`` run on node ``name``: in its network namespace (``nsenter``, which, unlike ``ip
        netns exec``, keeps this machine's /sys and its cgroups, which slurmd needs) and a UTS
        namespace whose host name is the node's, and a mount namespace where /etc/hosts names every
        node.  The node's name is the command's last word."""
        hosts = self.root / "hosts"
        if not hosts.exists():
            # the nodes know each other by name, as a real cluster's do (an exported script's
            # SlurmClusterResolver dials n0:port): a hosts file of their own, over /etc/hosts
            # in their mount namespace only
            known = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
            hosts.write_text(known + "".join(f"{addr} {node}\n" for node, addr in self.nodes.items()))
        inner = " ".join(
            [f"mount --bind {hosts} /etc/hosts && hostname {name} &&", "exec", *cmd, "-f", str(self.conf)]
        )
        return [
            "nsenter",
            f"--net=/run/netns/{self.namespaces[index]}",
            "unshare",
            "--uts",
            "--mount",
            "sh",
            "-c",
            inner,
            name,
        ]

    def kill_node(self, name: str) -> None:
        """Node ``name`` dies: its link goes down first (nothing it had open is told), then every
        process it ran (slurmd, the job's steps, their tasks) is killed."""
        from .sshhosts import _run

        index = list(self.nodes).index(name)
        _run("ip", "link", "set", f"tfmv{self._tag()}h{index}", "down")
        ns = self.namespaces[index]
        for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), 9)
            except (OSError, ValueError):
                pass

    def node_states(self) -> dict[str, str]:
        """Each node's state as Slurm says it (``{"n0": "idle", "n1": "down*"}``)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def _wait(self, ready, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(
                    f"{f.name}: {f.read_text(errors='replace')[-800:]}"
                    for f in sorted((self.root / "log").glob("*"))
                )
                raise RuntimeError(f"the private Slurm did not come up ({what}; ended: {dead})\n{logs}")
            time.sleep(0.2)

    def run(self, *cmd: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """A Slurm command against this Slurm (``run("squeue", "-h")``)."""
        env = {**os.environ, **self.env}
        return subprocess.run(list(cmd), capture_output=True, text=True, env=env, timeout=timeout)

    def _idle(self) -> bool:
        out = self.run("sinfo", "-h", "-o", "%T").stdout.split()
        return bool(out) and all(s.rstrip("*") in ("idle", "mixed", "allocated") for s in out)

    def queue(self) -> list[str]:
        """The jobs Slurm still has queued or running: ``"12 RUNNING"`` each."""
        out = self.run("squeue", "-h", "-o", "%i %T").stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def describe(self) -> str:
        """The queue with Slurm's reasons and the node's state, for a test's failure message."""
        queue = self.run("squeue", "-h", "-o", "%i %T %r").stdout.strip() or "(empty)"
        node = self.run("sinfo", "-h", "-N", "-o", "%N %T %E").stdout.strip()
        return f"queue: {queue}; node: {node}"

    def close(self) -> None:
        """Cancel every job, then end the daemons (slurmd first: it ends its steps)."""
        if any(p.poll() is None for p in self.procs):
            self.run("scancel", "--user", "root")
            deadline = time.monotonic() + 10
            while self.queue() and time.monotonic() < deadline:
                time.sleep(0.2)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        if self.namespaces or self.links:
            from .sshhosts import _run

            for ns in self.namespaces:
                for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                    try:
                        os.kill(int(pid), 9)
                    except (OSError, ValueError):
                        pass
                _run("ip", "netns", "del", ns, check=False)
            for link in self.links:
                _run("ip", "link", "del", link, check=False)


@contextlib.contextmanager
def running(root: Path, nodes: int | None = None):
    """A :class:`PrivateSlurm` that this process's Slurm commands (and tfmagic's) use while the
    block runs (``SLURM_CONF``, restored after), closed at its end."""
    private = PrivateSlurm(root, nodes=nodes)
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(private.conf)
    try:
        yield private
    finally:
        private.close()
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
