"""A soak: one real kernel driven through random lifecycle actions, checked after each one.

After every action: the cell took no more than its bound, no traceback
reached it, and the live task processes are exactly what the cluster and the
spare pool say.  At the end the kernel is killed with SIGKILL and nothing it
started may remain.  The seed is in the test's id and in every failure;
``TFMAGIC_SOAK_SEEDS=1,2,3 python -m pytest tests/test_soak.py`` runs more.
Seeds of failures that were fixed stay in ``SEEDS`` as regression cases.
"""

from __future__ import annotations

import os
import random
import signal
import time

import psutil
import pytest

from .conftest import assert_gone, task_processes
from .kernelutil import Kernel, KernelAborted, record_abort

pytestmark = [pytest.mark.soak, pytest.mark.kernel, pytest.mark.cluster]

#: 0, and seeds that once failed (kept as regression cases). 10: a `restart ps:0 --force` just after
#: an async run began connecting froze the kernel (TensorFlow's change of the connection waited for
#: the killed ps holding Python's global lock, so the restart could not bring it back): 3 of 3 runs
#: before client.steady_connection, 27 s after it
SEEDS = [0, 1, 2, 3, 10]
ACTIONS = 30


def _seeds() -> list[int]:
    extra = os.environ.get("TFMAGIC_SOAK_SEEDS", "")
    return [int(s) for s in extra.split(",") if s.strip()] or SEEDS


def _kernel_processes(kernel_pid: int) -> dict[str, set[int]]:
    """This kernel's task processes (tfmagic.task_main) and the keepers beside them."""
    found: dict[str, set[int]] = {"tasks": set(), "keepers": set()}
    try:
        kids = psutil.Process(kernel_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for p in kids:
        try:
            cmd = p.cmdline()
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if "tfmagic.task_main" in cmd:
            found["tasks"].add(p.pid)
        elif "tfmagic.procs.tree" in cmd:
            found["keepers"].add(p.pid)
    return found


class Soak:
    def __init__(self, kernel: Kernel, rng: random.Random, seed: int) -> None:
        self.k = kernel
        self.rng = rng
        self.seed = seed
        self.log: list[str] = []
        self.stopped: list[int] = []  # pids we SIGSTOPped from outside, to SIGCONT after the next action

    def cell(self, code: str, bound: float, interrupt_after: float | None = None):
        t0 = time.monotonic()
        try:
            reply = self.k.run(code, timeout=bound + 60, interrupt_after=interrupt_after)
        except TimeoutError as exc:
            raise AssertionError(
                f"seed {self.seed}: {exc}\naction log:\n" + "\n".join(self.log[-12:])
            ) from None
        took = time.monotonic() - t0
        self.log.append(f"{code.splitlines()[0]!r}: {reply.status} in {took:.1f} s")
        where = f"seed {self.seed}, action log:\n" + "\n".join(self.log[-12:])
        assert took <= bound, f"took {took:.1f} s (bound {bound} s); {where}\n{reply.text[-2000:]}"
        text = reply.text
        assert "Traceback" not in text and 'File "' not in text, (
            f"a traceback reached the cell; {where}\n{text[-3000:]}"
        )
        if reply.status == "error":
            assert reply.error["ename"] in ("UsageError", "ShownAbove", "KeyboardInterrupt"), (
                f"{reply.error['ename']}: {reply.error.get('evalue')}; {where}"
            )
        return reply

    def tasks(self) -> list[str]:
        return self.k.value(
            "[] if tfmagic.current_cluster() is None or not tfmagic.current_cluster().running "
            "else list(tfmagic.current_cluster().procs)"
        )

    def check_processes(self) -> None:
        owned = set(
            self.k.value("[p.pid for p in __import__('tfmagic.procs.owner', fromlist=['owner']).processes()]")
        )
        deadline = time.monotonic() + 15
        while True:
            live = _kernel_processes(self.k.pid)
            if live["tasks"] == owned:
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"live task processes {sorted(live['tasks'])} differ from what the kernel owns "
                    f"{sorted(owned)}; seed {self.seed}, log:\n" + "\n".join(self.log[-12:])
                )
            time.sleep(0.2)
            owned = set(
                self.k.value(
                    "[p.pid for p in __import__('tfmagic.procs.owner', fromlist=['owner']).processes()]"
                )
            )
        assert len(live["keepers"]) <= len(live["tasks"]), live

    # -- actions ----------------------------------------------------------------------
    def start(self):
        ps, workers = self.rng.choice([(0, 1), (1, 1), (1, 2), (1, 3)])
        replace = " --replace" if self.rng.random() < 0.7 else ""
        self.cell(f"%tf_cluster start --ps {ps} --workers {workers}{replace}", bound=120)

    def stop(self):
        self.cell("%tf_cluster stop", bound=20)

    def train(self):
        mode = self.rng.choice(["sync", "async", "compare"])
        wait = self.rng.random() < 0.4
        steps = self.rng.choice([30, 200, 5000])
        if wait:
            steps = min(steps, 200)
        self.cell(
            f"run = %tf_train --mode {mode} --steps {steps} --no-dashboard" + (" --wait" if wait else ""),
            bound=120 if wait else 30,
        )

    def slow(self):
        tasks = [t for t in self.tasks() if t.startswith("worker")]
        if tasks:
            factor = self.rng.choice([1, 2, 4])
            self.cell(f"%tf_cluster slow {self.rng.choice(tasks)} --factor {factor}", bound=15)

    def kill(self):
        tasks = self.tasks()
        if tasks:
            self.cell(f"%tf_cluster kill {self.rng.choice(tasks)}", bound=15)

    def restart(self):
        tasks = self.tasks()
        if tasks:
            self.cell(f"%tf_cluster restart {self.rng.choice(tasks)} --force", bound=60)

    def sigstop(self):
        pids = self.k.value(
            "[] if tfmagic.current_cluster() is None else [p.pid for p in tfmagic.current_cluster().procs.values() if p.alive]"
        )
        if pids:
            pid = self.rng.choice(pids)
            os.kill(pid, signal.SIGSTOP)
            self.stopped.append(pid)
            self.log.append(f"SIGSTOP {pid} from outside")

    def px(self):
        self.cell("%%tf_px --targets worker:*\nprint(job_name, task_index)", bound=60)

    def device(self):
        tasks = self.tasks()
        if tasks:
            self.cell(f"%%tf_device {self.rng.choice(tasks)}\nx = (tf.constant(2.0) * 3).numpy()", bound=30)

    def interrupt(self):
        if self.tasks():
            self.cell("%%tf_px --targets worker:*\nimport time\ntime.sleep(30)", bound=30, interrupt_after=2)

    def reload(self):
        self.cell("%unload_ext tfmagic\n%load_ext tfmagic", bound=30)

    def status(self):
        self.cell("%tf_cluster status", bound=20)

    def run(self, actions: int) -> None:
        choices = [
            (self.start, 4),
            (self.stop, 2),
            (self.train, 4),
            (self.slow, 2),
            (self.kill, 2),
            (self.restart, 2),
            (self.sigstop, 1),
            (self.px, 2),
            (self.device, 2),
            (self.interrupt, 1),
            (self.reload, 1),
            (self.status, 1),
        ]
        funcs, weights = zip(*choices, strict=True)
        for _ in range(actions):
            pending, self.stopped = self.stopped, []
            self.rng.choices(funcs, weights)[0]()
            for pid in pending:  # a stop from outside lasts one action
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                self.log.append(f"SIGCONT {pid}")
            self.check_processes()


@pytest.mark.parametrize("seed", _seeds())
def test_soak(seed):
    """A kernel that aborts inside TensorFlow (issue 22 item 11, not yet understood) is recorded in
    test-artifacts/kernel-aborts.log, its tasks must die with it, and the seed runs once more."""
    before = set(task_processes())
    try:
        _soak(seed)
    except KernelAborted as first:
        record_abort(f"soak seed {seed}", str(first))
        assert_gone(set(task_processes()) - before, timeout=15)  # they die with an aborted kernel too
        _soak(seed)


def _soak(seed: int) -> None:
    rng = random.Random(seed)
    k = Kernel(env={"TFMAGIC_SPARES": "1", "TFMAGIC_SPARE_BUDGET": "1GB"})
    soak = Soak(k, rng, seed)
    try:
        k.ok("%load_ext tfmagic\nimport tfmagic, tensorflow as tf", timeout=60)
        soak.run(ACTIONS)
        stopped = soak.stopped
        live = _kernel_processes(k.pid)
        os.kill(k.pid, signal.SIGKILL)
        assert_gone(live["tasks"] | live["keepers"], timeout=15)
        for pid in stopped:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        try:
            os.kill(k.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            k.kc.stop_channels()
            k.km.cleanup_resources()
        except Exception:  # noqa: BLE001 - the kernel was killed on purpose; its channels may be gone
            pass
        k.stderr_path.unlink(missing_ok=True)
