"""Task processes as one Slurm job: ``SlurmCluster(ps=1, workers=4, partition="debug", time="1:00:00")``.

A start is one batch job (``sbatch``) with a Slurm task per TensorFlow task; its one job step
(``srun``) runs the relay of :mod:`tfmagic.launchers.slurm_task` on whichever nodes Slurm
allocates.  Each relay dials back to an authenticated listener in this process, as Spark's do
(:mod:`tfmagic.launchers.relayed`), and starts its task as a child: from then on the task is an
ordinary tfmagic task (training, ``%%tf_px``, status, logs, the doctor).  A restart is a job of
one task.  While a job waits in the queue the start shows Slurm's reason (``job 1234 pending:
Resources``) and gives up, cancelling it, after ``connect_timeout`` seconds.

What ends a job, each path tested against a real Slurm:

* ``cluster.stop()``: every task ends, its relay exits, the step and the job end; anything
  still queued or running is cancelled (``scancel``).
* The kernel dies, even by ``kill -9``: the relays' connections end, so do the tasks and the
  relays, and with them the job (the watchdog is inside the job: no kernel is needed to end it).
  A job still *pending* when its kernel dies starts later, finds nobody to dial and ends.
* ``scancel`` from outside: Slurm kills the relays, the tasks read end-of-file and end; the
  cluster sees its tasks lost, and the doctor and ``status`` say the job was cancelled.

Security: the relays prove a per-cluster secret (written to a file only you can read, beside the
cluster's logs, never on a command line); the channel is authenticated, not encrypted, and the
TensorFlow servers run any graph anyone who reaches them sends (each kept on the one address its
spec names unless ``guard=False``).  On a multi-node Slurm the nodes must reach this process at
``address`` (by default loopback, for a Slurm whose nodes are this machine), and read the config
file at the same path (a shared home or scratch file system, as Slurm clusters have).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import BadArgument, ClusterStartError
from ..logs import read_tail
from .channel import TaskProcess
from .process import PACKAGE_PARENT, pythonpath_with_package
from .relayed import RelayedLauncher
from .spark.jobs import Batch, Jobs
from .spark.relay import Relay

#: Slurm's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes, days-hours:minutes:seconds (sbatch --time)
_TIME = re.compile(r"^(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(?::\d{1,2}){0,2})$")
#: job states after which nothing of the job runs (squeue --states)
ENDED = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "REVOKED",
    "TIMEOUT",
}
#: pending reasons no wait will cure: the job asks what the partition (or account) never gives
NEVER = (
    "PartitionConfig",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
)
INSTALL_HINT = (
    "install Slurm's client commands on this machine (Debian: apt-get install slurm-client) and "
    "point them at your cluster (SLURM_CONF, or /etc/slurm/slurm.conf)"
)


def slurm_command(name: str) -> str:
    """The path of Slurm's ``name`` (sbatch, squeue, scancel, sinfo), or one line saying what to do."""
    found = shutil.which(name)
    if found is None:
        raise ClusterStartError(f"no {name} on the PATH: the slurm backend needs Slurm; {INSTALL_HINT}")
    return found


def _run(args: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _error_line(text: str) -> str:
    """The line of a Slurm command's error output that says why (its last), without the prefix."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else "no reason given"
    return line.removeprefix("sbatch: error: ").removeprefix("squeue: error: ")


def check_time(value: str | None) -> str | None:
    """``value`` if Slurm reads it as a time limit (``90``, ``1:30:00``, ``2-12``), else one line."""
    if value is None:
        return None
    text = str(value).strip()
    if not _TIME.match(text):
        raise BadArgument(
            f"time={value!r} is not a Slurm time limit; give minutes (90), hours:minutes:seconds "
            "(1:30:00) or days-hours (2-12)"
        )
    return text


def check_sbatch_args(args: Sequence[str] | str | None) -> tuple[str, ...]:
    """Extra ``sbatch`` options (``["--gres=gpu:1"]``), each an option on one line."""
    if args is None:
        return ()
    items = shlex.split(args) if isinstance(args, str) else [str(a) for a in args]
    for item in items:
        if not item.startswith("-") or "\n" in item or "\r" in item:
            raise BadArgument(
                f"{item!r} is not an sbatch option; give options such as --gres=gpu:1 or --qos=debug"
            )
    return tuple(items)


def partitions() -> list[str]:
    """The partitions Slurm has (``sinfo``); the default one is marked with ``*`` by sinfo, not here."""
    done = _run([slurm_command("sinfo"), "-h", "-o", "%P"])
    if done.returncode != 0:
        raise ClusterStartError(f"Slurm did not answer (sinfo: {_error_line(done.stderr)}); is slurmctld up?")
    return [p.strip().rstrip("*") for p in done.stdout.split() if p.strip()]


def job_state(job_id: str) -> tuple[str, str, str] | None:
    """``(state, reason, nodes)`` of a job Slurm still knows (``("RUNNING", "None", "n[0-1]")``),
    else ``None``; ``nodes`` is Slurm's node list, empty while the job waits."""
    done = _run([slurm_command("squeue"), "-h", "-j", job_id, "-o", "%T|%r|%N"], timeout=15.0)
    line = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    if line and not line.startswith("COMPLETING"):
        state, _, rest = line.partition("|")
        reason, _, nodes = rest.partition("|")
        return state.strip(), reason.strip(), nodes.strip()
    # ended (or ending: squeue says COMPLETING while the steps are killed): scontrol has the state
    done = _run(["scontrol", "show", "job", "-o", job_id], timeout=15.0) if shutil.which("scontrol") else None
    if done is not None and done.returncode == 0:
        fields = dict(kv.split("=", 1) for kv in done.stdout.split() if "=" in kv)
        if "JobState" in fields:
            nodes = fields.get("NodeList", "")
            return fields["JobState"], fields.get("Reason", "None"), "" if nodes == "(null)" else nodes
    return None


def is_final(state: str) -> bool:
    """Whether Slurm's ``state`` (``"CANCELLED by 0"``, ``"PENDING (Resources)"``) is a job's end."""
    return bool(state) and state.split()[0] in ENDED


def failed_nodes(nodes: str) -> list[str]:
    """Which of ``nodes`` (Slurm's node list of a job, ``n[0-1]``) Slurm holds down or failed: why
    a job ended NODE_FAIL."""
    if not nodes:
        return []
    down = _run([slurm_command("sinfo"), "-h", "-N", "-n", nodes, "-t", "down,fail,no_respond", "-o", "%N"])
    return sorted(set(down.stdout.split())) if down.returncode == 0 else []


class SlurmLauncher(RelayedLauncher):
    """Runs each task as a Slurm task: the cluster is one batch job (a restart, a job of one).

    Parameters
    ----------
    partition, time, account:
        ``sbatch --partition``, ``--time`` (``"1:00:00"``) and ``--account``; Slurm's defaults
        when left out.
    sbatch:
        More ``sbatch`` options, each kept as one ``#SBATCH`` line (``["--qos=debug"]``).
    worker_sbatch:
        Options for the workers only (``["--gpus-per-task=1"]``): the workers then run as a job
        of their own beside the ps tasks' job, so a ps (which runs on CPU) holds no GPU.  A start
        waits for both jobs; ending either ends the cluster's tasks in it, and ``stop`` both.
    cpus_per_task:
        ``sbatch --cpus-per-task`` (TensorFlow's thread pools are sized from the cores a task sees).
    python:
        The Python the nodes run (tfmagic and TensorFlow installed); this interpreter by default.
    address:
        Where the relays dial back to: an address of this machine the nodes reach.  Loopback by
        default, for a Slurm whose nodes are this machine.
    env:
        Extra environment for every task process.
    guard:
        Keep each TensorFlow server on the one address its spec names.
    connect_timeout:
        Seconds a job may wait in the queue and its relays take to dial back.
    """

    name = "slurm"
    where_tasks_run = "Slurm node"

    def __init__(
        self,
        *,
        partition: str | None = None,
        time: str | None = None,
        account: str | None = None,
        sbatch: Sequence[str] | str | None = None,
        worker_sbatch: Sequence[str] | str | None = None,
        cpus_per_task: int | None = None,
        python: str = sys.executable,
        address: str | None = None,
        env: dict[str, str | None] | None = None,
        guard: bool = True,
        connect_timeout: float = 300.0,
        poll: float = 1.0,
    ) -> None:
        self.sbatch_path = slurm_command("sbatch")
        self.partition = partition
        self.time = check_time(time)
        self.account = account
        self.sbatch_args = check_sbatch_args(sbatch)
        self.worker_sbatch_args = check_sbatch_args(worker_sbatch)
        if cpus_per_task is not None and (not isinstance(cpus_per_task, int) or cpus_per_task < 1):
            raise BadArgument(f"cpus_per_task={cpus_per_task!r}: give a whole number of cores, 1 or more")
        self.cpus_per_task = cpus_per_task
        if partition is not None:
            known = partitions()
            if partition not in known:
                raise BadArgument(
                    f"Slurm has no partition {partition!r}; it has {', '.join(known) or 'none'} (sinfo)"
                )
        self.python = python
        self.address = address
        self.loopback = address is None or address.startswith("127.") or address == "localhost"
        self.extra_env = dict(env or {})
        self.guard = guard
        self.connect_timeout = connect_timeout
        self.poll = poll
        self.jobs = Jobs()
        self.relay = Relay(self.jobs.claim, self._bind_address)
        self._client_address: str | None = None
        self._keeper: subprocess.Popen | None = None
        #: each task's batch by pid, kept after the task ended (what ended it, for status and training)
        self._batch_of: dict[int, Batch] = {}

    # -- placement ------------------------------------------------------------------------
    @property
    def host(self) -> str:  # type: ignore[override]
        """The address the relays dial back to."""
        return self.address or "127.0.0.1"

    def _bind_address(self) -> str:
        return self.host

    @property
    def where_key(self) -> str | None:
        return self.partition

    def running_as(self) -> str:
        return f"Slurm job(s) {', '.join(self.job_ids) or '(none running)'}"

    def describe(self) -> str:
        return f" as a Slurm job ({'partition ' + self.partition if self.partition else 'default partition'})"

    @property
    def job_ids(self) -> list[str]:
        """The Slurm jobs of this launcher that may still run (the start's, the restarts')."""
        with self.jobs.lock:
            return [b.job_id for b in self.jobs.batches.values() if b.job_id and not b.finished.is_set()]

    # -- a job --------------------------------------------------------------------------------
    def _script(self, batch: Batch, config_path: Path, out_path: Path, extra: Sequence[str] = ()) -> str:
        lines = [
            "#!/bin/sh",
            "#SBATCH --job-name=tfmagic",
            f"#SBATCH --ntasks={len(batch.slots)}",
            f"#SBATCH --output={out_path}",
            # a job Slurm requeued (after a node failure, say) would start tasks nobody waits for:
            # the cluster's tasks end with it, and the start is the user's to repeat
            "#SBATCH --no-requeue",
        ]
        lines += [f"#SBATCH --partition={self.partition}"] if self.partition else []
        lines += [f"#SBATCH --time={self.time}"] if self.time else []
        lines += [f"#SBATCH --account={self.account}"] if self.account else []
        lines += [f"#SBATCH --cpus-per-task={self.cpus_per_task}"] if self.cpus_per_task else []
        lines += [f"#SBATCH {arg}" for arg in (*self.sbatch_args, *extra)]
        lines.append(f"# tfmagic: {batch.description}")
        if self.loopback:  # a checkout that is not installed still works when the nodes are this machine
            lines.append(f"export PYTHONPATH={shlex.quote(PACKAGE_PARENT)}${{PYTHONPATH:+:$PYTHONPATH}}")
        relay = [self.python, "-u", "-m", "tfmagic.launchers.slurm_task", str(config_path)]
        lines.append("exec srun --unbuffered " + " ".join(shlex.quote(a) for a in relay))
        return "\n".join(lines) + "\n"

    def _submit(self, batch: Batch, extra: Sequence[str] = ()) -> Path:
        """Write the job's files beside the first task's log and ``sbatch`` it; returns its output file."""
        folder = Path(batch.slots[0].log_path).parent / "slurm"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        config = self.relay_config(batch, self.host, self.relay.listen())
        config_path = folder / f"{batch.id}.json"
        fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(config, f)
        out_path = folder / f"{batch.id}.out"
        script = folder / f"{batch.id}.sh"
        script.write_text(self._script(batch, config_path, out_path, extra))
        done = _run([self.sbatch_path, "--parsable", str(script)], timeout=60.0)
        if done.returncode != 0:
            with self.jobs.lock:
                self.jobs.batches.pop(batch.id, None)
            raise ClusterStartError(f"Slurm refused the job: {_error_line(done.stderr)} (sbatch {script})")
        batch.job_id = done.stdout.strip().split(";")[0]
        self._keep(batch.job_id)
        for slot in batch.slots:
            slot.note(f"Slurm job {batch.job_id} submitted ({script})")
        batch.thread = threading.Thread(
            target=self._watch, args=(batch,), name=f"tfmagic-slurm-{batch.job_id}", daemon=True
        )
        batch.thread.start()
        return out_path

    def _keep(self, job_id: str) -> None:
        """Tell the keeper (started on the first job) to cancel ``job_id`` if this process ends."""
        with self.jobs.lock:
            if self._keeper is None or self._keeper.poll() is not None:
                env = {**os.environ, "PYTHONPATH": pythonpath_with_package(os.environ.get("PYTHONPATH"))}
                self._keeper = subprocess.Popen(
                    [sys.executable, "-m", "tfmagic.launchers.slurm_task", "--keeper"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                    text=True,
                )
            try:
                assert self._keeper.stdin is not None
                self._keeper.stdin.write(job_id + "\n")
                self._keeper.stdin.flush()
            except OSError:
                pass

    def _watch(self, batch: Batch) -> None:
        """Follow the job in Slurm's queue until it ends (``batch.finished``), saying why it waits."""
        said = ""
        while not batch.finished.is_set():
            try:
                found = job_state(batch.job_id or "")
            except (OSError, subprocess.SubprocessError, ClusterStartError):
                found = ("UNKNOWN", "Slurm did not answer", "")
            if found is None or is_final(found[0]):
                if found is not None:
                    batch.state = found[0]
                elif not is_final(batch.state):  # a task's note may have learned how it ended first
                    batch.state = "ended"  # Slurm has forgotten the job already (MinJobAge)
                self.jobs.ended(batch)
                return
            state, reason, nodes = found
            batch.nodes = nodes or batch.nodes
            reason = "" if reason in ("None", "(null)") else reason
            batch.state = f"{state} ({reason})" if state == "PENDING" and reason else state
            if state == "PENDING" and reason != said:
                said = reason
                why = (
                    f"Slurm job {batch.job_id} pending: {reason}"
                    if reason
                    else f"Slurm job {batch.job_id} queued"
                )
                for slot in batch.slots:
                    slot.note(why)
                    self._say(slot.log_path, "queued", why)
            time.sleep(self.poll)

    def _say(self, log_path: str, stage: str, detail: str) -> None:
        progress = self.progress
        if progress is not None:
            progress(Path(log_path).stem.replace("-", ":", 1), stage, detail)

    def _wait_started(self, batch: Batch, out_path: Path) -> str | None:
        """Until every slot's task process runs (``None``), or what went wrong (a sentence)."""
        deadline = time.monotonic() + self.connect_timeout
        address = f"{self.host}:{self.relay.port}"
        while True:
            if all(s.started.is_set() and s.pid is not None for s in batch.slots):
                return None
            bad = next((s for s in batch.slots if s.started.is_set() and s.pid is None), None)
            if bad is not None:
                return f"a relay could not start its task: {bad.error or 'it ended'}"
            if batch.finished.is_set():
                said = read_tail(str(out_path), 3).strip().replace("\n", "; ")
                return (
                    f"Slurm job {batch.job_id} ended{'' if batch.state == 'ended' else f' ({batch.state})'} "
                    f"before every relay dialled back to {address}" + (f": {said}" if said else "")
                )
            never = next((r for r in NEVER if batch.state == f"PENDING ({r})"), None)
            if never is not None:
                return (
                    f"Slurm job {batch.job_id} can never start as asked ({never}: {len(batch.slots)} tasks"
                    f"{', ' + self.partition if self.partition else ''}{', time ' + self.time if self.time else ''} "
                    "ask more than the partition or account allows); ask for fewer tasks or less time, or "
                    "another partition (sinfo)"
                )
            if time.monotonic() > deadline:
                if batch.state.startswith("PENDING"):
                    reason = batch.state.removeprefix("PENDING").strip(" ()") or "no reason given"
                    return (
                        f"Slurm job {batch.job_id} was still pending after {self.connect_timeout:g} s: "
                        f"{reason} (squeue -j {batch.job_id})"
                    )
                waiting = sum(1 for s in batch.slots if not s.started.is_set())
                return (
                    f"{waiting} of {len(batch.slots)} tasks of Slurm job {batch.job_id} ({batch.state}) had not "
                    f"dialled back to {address} within {self.connect_timeout:g} s (can the nodes reach it? "
                    "give address= an address of this machine they reach)"
                )
            time.sleep(0.05)

    @staticmethod
    def _is_worker(log_path: str) -> bool:
        return Path(log_path).stem.startswith("worker-")

    def _start(self, log_paths: list[str]) -> list[Batch]:
        """Submit the job (two, ps and workers, with ``worker_sbatch``) and wait until every task runs."""
        groups = [log_paths]
        if self.worker_sbatch_args:
            groups = [
                [p for p in log_paths if not self._is_worker(p)],
                [p for p in log_paths if self._is_worker(p)],
            ]
        started: list[tuple[Batch, Path]] = []
        try:
            for paths in groups:
                if not paths:
                    continue
                batch = self.jobs.new_batch(paths, barrier=len(paths) > 1, scheduler="slurm")
                extra = self.worker_sbatch_args if self._is_worker(paths[0]) else ()
                started.append((batch, self._submit(batch, extra)))
            for batch, out_path in started:
                problem = self._wait_started(batch, out_path)
                if problem is not None:
                    raise ClusterStartError(problem, log_tail=read_tail(str(out_path), 20))
        except BaseException:
            for batch, _ in started:
                self.jobs.abandon(batch, self.cancel)
            raise
        return [batch for batch, _ in started]

    # -- the contract ---------------------------------------------------------------------
    def _process(self, slot) -> TaskProcess:
        proc = super()._process(slot)
        self._batch_of[proc.pid] = slot.batch
        return proc

    def spawn_many(self, log_paths: list[str], hosts: list[str]) -> list[TaskProcess]:
        """One batch job with a Slurm task per log path; returns when every task process runs."""
        if not log_paths:
            return []
        slots = {slot.log_path: slot for batch in self._start(log_paths) for slot in batch.slots}
        return [self._process(slots[path]) for path in log_paths]

    def spawn(self, log_path: str, host: str | None = None) -> TaskProcess:
        """One task again (a restart): a job of one task, which must land where the old one was."""
        (batch,) = self._start([log_path])
        return self._restarted(
            batch, host, "; stop the cluster and start it again (or pin nodes with sbatch=['-w', ...])"
        )

    def cancel(self, batch: Batch) -> None:
        """``scancel`` the batch's job (its relays, and so its tasks, end)."""
        if batch.job_id and shutil.which("scancel"):
            _run([slurm_command("scancel"), batch.job_id], timeout=30.0)

    def diagnose(self, proc: TaskProcess, log_tail: str) -> str:
        said = super().diagnose(proc, log_tail)
        cause = self.ended_by(proc)
        return said or (f"{cause}: start the cluster again" if cause else "")

    def close(self) -> None:
        """Cancel this launcher's Slurm jobs that still run or wait; close the listener and the keeper."""
        self.jobs.close(self.cancel)
        self.relay.close()
        keeper, self._keeper = self._keeper, None
        if keeper is not None and keeper.stdin is not None:
            try:
                keeper.stdin.close()  # it cancels what it was told (ended already) and exits
            except OSError:
                pass
            try:
                keeper.wait(30)
            except subprocess.TimeoutExpired:
                keeper.kill()

    def client_address(self, defn) -> str | None:
        """``None`` (TF's ``localhost``) while the nodes are this machine; else this machine's
        address the relays dialled, with this process's client port."""
        if self.loopback:
            return None
        if self._client_address is None:
            from .. import client

            self._client_address = f"{self.host}:{client.client_port()}"
        return self._client_address

    def ended_by(self, proc: Any) -> str:
        batch = self._batch_of.get(getattr(proc, "pid", None))
        if batch is None or batch.job_id is None or batch.closed:  # closed: this process cancelled it
            return ""
        state = batch.state
        deadline = time.monotonic() + 3.0
        while not batch.finished.is_set():
            try:
                found = job_state(batch.job_id)
            except (OSError, subprocess.SubprocessError, ClusterStartError):
                return ""
            if found is None:
                # Slurm has forgotten the job (MinJobAge) or did not answer: the queue watcher may
                # have seen how it ended (measured: one task's note said "ended", its twins' CANCELLED)
                seen = batch.finished.wait(max(0.0, min(2 * self.poll + 1, deadline - time.monotonic())))
                state = batch.state if seen and is_final(batch.state) else "ended"
                break
            state = found[0]
            batch.nodes = found[2] or batch.nodes
            # COMPLETING: Slurm is ending the job's steps (a scancel a moment ago, or the job's end);
            # its final state follows within a second
            if state != "COMPLETING" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if is_final(state) and not is_final(batch.state):
            batch.state = state  # what one task's note learned, every other's says
        if state != "ended" and (not is_final(state) or state.split()[0] == "COMPLETED"):
            return ""
        down = self._down_nodes(batch) if state == "ended" or state.startswith("NODE_FAIL") else ""
        if down:
            return f"Slurm ended job {batch.job_id} ({'' if state == 'ended' else 'NODE_FAIL: '}{down} stopped answering)"
        return f"Slurm ended job {batch.job_id} ({state})"

    @staticmethod
    def _down_nodes(batch: Batch) -> str:
        """The nodes of ``batch``'s job that Slurm holds down (asked once, while it still says)."""
        if batch.failed_nodes is None:
            try:
                batch.failed_nodes = failed_nodes(batch.nodes)
            except (OSError, subprocess.SubprocessError, ClusterStartError):
                batch.failed_nodes = []
        return ", ".join(batch.failed_nodes)

    def task_note(self, proc: Any) -> str:
        batch = self._batch_of.get(getattr(proc, "pid", None))
        if batch is None or batch.job_id is None:
            return ""
        if getattr(proc, "alive", False):
            slot = self.jobs.get(proc.pid)
            return f"Slurm job {batch.job_id} on {(slot.hostname if slot else None) or 'a node'}"
        return self.ended_by(proc) or f"Slurm job {batch.job_id}"
