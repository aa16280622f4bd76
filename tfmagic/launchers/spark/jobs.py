"""The Spark jobs that run a launcher's tasks, and the task slots each one serves.

A :class:`Batch` is one Spark job (barrier mode for a whole cluster, a
one-task job for a restart); each of its Spark tasks serves one
:class:`Slot`: a relay claims the slot when it connects back (see
:mod:`.relay`) and the slot then holds its two connections, the task's pid
and, at the end, its exit code.  :class:`Jobs` keeps them: it submits a
job, waits until every slot's task process runs, turns away a relay whose
slot is taken, and abandons (cancels) a job.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .context import SharedContext, error_summary

#: how a launcher cancels a batch's job (Spark: its job group; Slurm: scancel)
Cancel = Callable[["Batch"], None]

log = logging.getLogger("tfmagic.spark")

_ids = itertools.count(1)


@dataclass
class Slot:
    """One task process being (or having been) served by one relay."""

    batch: Batch
    index: int
    log_path: str
    control: socket.socket | None = None
    log_sock: socket.socket | None = None
    relay_pid: int | None = None
    attempt: int | None = None
    hostname: str | None = None
    address: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    error: str | None = None
    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def note(self, text: str) -> None:
        """A line in the task's log file (on this machine)."""
        try:
            with open(self.log_path, "ab") as f:
                f.write(f"tfmagic: {self.batch.scheduler}: {text}\n".encode())
        except OSError:
            pass

    def close(self) -> None:
        for sock in (self.control, self.log_sock):
            if sock is None:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


@dataclass
class Batch:
    """One Spark job serving some task slots."""

    id: str
    group: str
    description: str
    barrier: bool
    slots: list[Slot] = field(default_factory=list)
    result: list | None = None
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    closed: bool = False
    #: who runs the job, for the tasks' log lines: ``spark`` or ``slurm``
    scheduler: str = "spark"
    #: the scheduler's id of the job (Slurm's job id), once submitted
    job_id: str | None = None
    #: the scheduler's last word on the job (Slurm: ``PENDING (Resources)``, ``CANCELLED``)
    state: str = ""
    #: where the job runs, in the scheduler's words (Slurm's node list, ``n[0-1]``)
    nodes: str = ""
    #: the nodes whose failure ended the job (Slurm's NODE_FAIL), once asked
    failed_nodes: list[str] | None = None


class Jobs:
    """A launcher's Spark jobs (``batches``, by id) and its live slots (``by_pid``, by task pid)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.batches: dict[str, Batch] = {}
        self.by_pid: dict[int, Slot] = {}

    # -- submitting ----------------------------------------------------------------
    def new_batch(self, log_paths: list[str], barrier: bool, scheduler: str = "spark") -> Batch:
        """A batch with one slot per log path (``worker-1.log`` is ``worker:1`` in the Spark UI)."""
        tasks = ", ".join(Path(p).stem.replace("-", ":", 1) for p in log_paths)
        batch_id = f"{os.getpid()}-{next(_ids)}-{secrets.token_hex(4)}"
        batch = Batch(
            id=batch_id,
            group=f"tfmagic-{batch_id}",
            description=f"tfmagic: {tasks}" + (" (barrier)" if barrier else " (restart)"),
            barrier=barrier,
            scheduler=scheduler,
        )
        batch.slots = [Slot(batch, i, p) for i, p in enumerate(log_paths)]
        with self.lock:
            self.batches[batch.id] = batch
        return batch

    def submit(self, ctx: SharedContext, batch: Batch, partition_fn: Callable, master: str) -> None:
        """Run ``partition_fn`` as ``batch``'s Spark job, one partition per slot, in a thread of its own."""
        sc = ctx.sc
        n = len(batch.slots)
        for slot in batch.slots:
            slot.note(f"submitting to Spark ({master}) as part of job group {batch.group}")

        def run() -> None:
            try:
                sc.setJobGroup(batch.group, batch.description, interruptOnCancel=True)
                rdd = sc.parallelize(range(n), n)
                if batch.barrier:
                    rdd = rdd.barrier()
                batch.result = rdd.mapPartitions(partition_fn).collect()
            except BaseException as exc:  # noqa: BLE001 - reported by whoever waits on the batch
                batch.error = exc
            finally:
                self.ended(batch)

        batch.thread = threading.Thread(target=run, name=f"tfmagic-spark-job-{batch.id}", daemon=True)
        batch.thread.start()

    def ended(self, batch: Batch) -> None:
        """``batch``'s job ended (the scheduler says so): dropped once none of its tasks runs."""
        batch.finished.set()
        with self.lock:
            if all(s.done.is_set() or s.control is None for s in batch.slots):
                self.batches.pop(batch.id, None)

    def wait_started(
        self, batch: Batch, timeout: float, relay_address: str, ui_url: str | None
    ) -> str | None:
        """Until every slot's task process runs (``None``), or what went wrong (a sentence)."""
        deadline = time.monotonic() + timeout
        while True:
            if all(s.started.is_set() and s.pid is not None for s in batch.slots):
                return None
            if batch.error is not None:
                return f"Spark could not run the job: {error_summary(batch.error)}"
            if batch.finished.is_set():
                errors = [r[2] for r in batch.result or [] if len(r) > 2 and r[2]]
                return f"the Spark tasks ended before every relay connected back to {relay_address}" + (
                    f": {errors[0]}" if errors else ""
                )
            bad = next((s for s in batch.slots if s.started.is_set() and s.pid is None), None)
            if bad is not None:
                return f"a relay could not start its task: {bad.error or 'it ended'}"
            if time.monotonic() > deadline:
                waiting = sum(1 for s in batch.slots if not s.started.is_set())
                return (
                    f"{waiting} of {len(batch.slots)} Spark tasks had not started within "
                    f"{timeout:g} s (not enough free task slots? see the Spark UI at {ui_url})"
                )
            time.sleep(0.05)

    # -- relays ---------------------------------------------------------------------
    def claim(self, hello: dict[str, Any], conn: socket.socket) -> tuple[Slot | None, str]:
        """Give ``conn`` to the slot an authenticated relay serves, or say why it gets none."""
        with self.lock:
            batch = self.batches.get(str(hello.get("batch")))
            if batch is None or batch.closed:
                return None, "no such job (stopped?)"
            index = hello.get("slot")
            if not isinstance(index, int) or not 0 <= index < len(batch.slots):
                return None, f"no slot {index!r} in this job"
            slot = batch.slots[index]
            channel = hello.get("channel")
            if channel == "control":
                if slot.control is not None or slot.done.is_set():
                    return None, f"slot {index} was served already (a retried Spark attempt)"
                slot.relay_pid = hello.get("relay_pid")
                slot.attempt = hello.get("attempt")
                slot.hostname = hello.get("hostname")
                slot.control = conn
                return slot, ""
            if channel == "log":
                if (
                    slot.control is None
                    or slot.log_sock is not None
                    or hello.get("relay_pid") != slot.relay_pid
                ):
                    return None, f"slot {index}'s log connection does not match its control connection"
                slot.log_sock = conn
                return slot, ""
            return None, f"unknown channel {channel!r}"

    # -- slots of live tasks -------------------------------------------------------------
    def adopt(self, slot: Slot, taken: set[int], fake_pid: Callable[[], int]) -> int:
        """Register ``slot`` under its task's pid (a made-up negative one if that pid is taken
        here: another host's task with the same pid) and return that pid."""
        with self.lock:
            pid = slot.pid
            if pid is None or pid in taken or pid in self.by_pid:
                pid = fake_pid()
            self.by_pid[pid] = slot
            return pid

    def get(self, pid: int | None) -> Slot | None:
        return self.by_pid.get(pid) if pid is not None else None

    def forget(self, pid: int) -> None:
        """The task ``pid`` ended: drop its slot, and its batch once every task of it ended."""
        with self.lock:
            slot = self.by_pid.pop(pid, None)
            if slot is None:
                return
            batch = slot.batch
            if batch.finished.is_set() and all(s.done.is_set() for s in batch.slots):
                self.batches.pop(batch.id, None)

    # -- ending --------------------------------------------------------------------------
    def abandon(self, batch: Batch, cancel: Cancel | None) -> None:
        """Close a batch's connections and cancel its job (its tasks end with both)."""
        with self.lock:
            batch.closed = True
        for slot in batch.slots:
            slot.close()
        if not batch.finished.is_set() and cancel is not None:
            try:
                cancel(batch)
            except Exception as exc:  # noqa: BLE001 - the scheduler may be gone already
                log.info("cancelling %s failed: %s", batch.group, exc)
            batch.finished.wait(30)
        with self.lock:
            self.batches.pop(batch.id, None)

    def close(self, cancel: Cancel | None) -> None:
        """End every job: a job whose tasks all ended finishes as a success, the rest are cancelled."""
        with self.lock:
            batches = list(self.batches.values())
        for batch in batches:
            if all(s.done.is_set() for s in batch.slots):
                batch.finished.wait(10)
            if not batch.finished.is_set():
                self.abandon(batch, cancel)
