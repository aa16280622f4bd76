"""A real Slurm on this machine for the tests: munged, slurmctld and slurmd, private to one run.

Debian's packages (``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``; ``.ci/run`` installs them)
run here as root from a folder of their own: their own munge key and socket, their own ports,
state and spool, and a ``slurm.conf`` the client commands find through ``SLURM_CONF`` (set in this
process's environment while the Slurm runs, so kernels and tfmagic's own calls find it too).  One
node (this machine, by its host name) in one partition ``debug``; the node says it has
:data:`CPUS` cores (``SlurmdParameters=config_overrides``) so that a ps and a few workers fit on two
real ones, as tasks share cores on a laptop.  Nothing here is mocked: ``sbatch`` queues, slurmd
starts the job's step, ``scancel`` kills it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tfmagic.network.ports import free_port

CPUS = 8
DAEMONS = ("munged", "slurmctld", "slurmd")


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


class PrivateSlurm:
    """One running Slurm: ``conf`` (its slurm.conf), ``env`` (``SLURM_CONF``), ``queue()``, ``close()``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []
        for sub in ("state", "spool", "log"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        self.socket = root / "munge.sock"
        self.conf = root / "slurm.conf"
        self.node = socket.gethostname()
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=tfmagic-tests",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.socket}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={root / 'state'}",
                    f"SlurmdSpoolDir={root / 'spool'}",
                    f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                    f"SlurmdPidFile={root / 'slurmd.pid'}",
                    f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
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
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={CPUS} Sockets=1 CoresPerSocket={CPUS} "
                    "ThreadsPerCore=1 RealMemory=16000 State=UNKNOWN",
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
            self._start([_daemon("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._start([_daemon("slurmd"), "-D", "-f", str(self.conf)])
            self._wait(self._idle, "the Slurm node to be idle (sinfo)", timeout=60)
        except BaseException:
            self.close()
            raise

    def _start(self, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{Path(cmd[0]).name}.out", "ab")  # noqa: SIM115 - the daemon's
        env = {**os.environ, **self.env}
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env))
        log.close()

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
