"""A seeded fault soak over the surfaces the last round added: run it as ``python tests/fault_soak.py SEED``.

One cluster (a ps behind the modelled network's relay, two workers, paced), and random actions while
runs train: add and remove workers, change the ps's card, kill and stop the relay, kill, restart and
stop tasks, stop a run midway (an interrupt's path), start runs of every mode. After each action:

* nothing waits longer than 10 s without the hang doctor naming why: when a run makes no update for
  10 s, ``cluster.why()`` must name a waiter or a task in an odd state (a run that has not made its
  first update yet, still connecting and tracing, has 60 s: that is CPU work no call waits on);
* no applied update is lost: when a run ends, the ps's global step equals the updates it recorded, each
  step once (runs that end with an error say it in one line instead);
* an error an action causes is one line, a :class:`~tfmagic.errors.TfmagicError`.

At the end the cluster stops and nothing it started may live. A separate process (the test runs this
one under a timeout) so that a hang is a failure with the stacks dumped, not a hung suite, and so
that the cluster is this process's only one. Prints one ``ACTION`` line per action and ``PIDS`` (every
process the cluster started) for the test to check, then ``CLEAN``.
"""

from __future__ import annotations

import faulthandler
import os
import random
import signal
import subprocess
import sys
import time

import tfmagic
from tfmagic.errors import TfmagicError

#: the doctor must name a wait this long
STALL_S = 10.0
#: the bound for a run that has not made its first update yet (connecting, tracing)
WARMUP_S = 60.0
MODES = ("async", "sync", "ssp")


def say(*parts) -> None:
    print(*parts, flush=True)


class Soak:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.cluster = tfmagic.LocalCluster(
            ps=1, workers=2, spares=False, pace="60ms", net="ps:0 rate=200mbit"
        )
        self.cluster.start()
        self.run = None
        self.pids: set[int] = set()
        self.stopped: list[int] = []  # pids SIGSTOPped by an action, continued by the next
        self.actions = 0
        self.runs = 0
        self.remember()

    # -- bookkeeping ---------------------------------------------------------------------
    def remember(self) -> None:
        for proc in self.cluster.procs.values():
            if proc.pid:
                self.pids.add(proc.pid)
            if getattr(proc, "task_pid", None):
                self.pids.add(proc.task_pid)
        shaper = self.cluster.shaper
        if shaper is not None and shaper.pid:
            self.pids.add(shaper.pid)

    def workers(self) -> list[str]:
        return [str(t) for t in self.cluster.tasks("worker")]

    def one_line(self, what: str, exc: TfmagicError) -> None:
        text = str(exc)
        assert "\n" not in text.strip() and "Traceback" not in text, f"{what}: not one line: {text!r}"
        say(f"  refused ({type(exc).__name__}): {text[:160]}")

    # -- actions -------------------------------------------------------------------------
    def start_run(self) -> None:
        if self.run is not None and self.run.running:
            return self.stop_run()
        mode = self.rng.choice(MODES)
        opts = {"staleness": 2} if mode == "ssp" else {}
        self.runs += 1
        self.run = tfmagic.train(
            self.cluster, mode, steps=10**6, block=False, name=f"soak-{self.runs}-{mode}", **opts
        )
        say(f"  {mode} run started")

    def stop_run(self) -> None:
        run = self.run
        if run is None:
            return self.start_run()
        run.stop()
        self.check_ended(run)
        self.run = None

    def check_ended(self, run) -> None:
        if run.error is not None:
            text = str(run.error)
            assert "\n" not in text.strip(), f"the run's error is not one line: {text!r}"
            say(f"  run ended with: {text[:160]}")
            return
        h = run.history
        step = run.params.read_step() if run.params is not None else None
        if step is None:  # stopped before its variables were made: nothing applied, nothing recorded
            assert not h.global_steps, "updates recorded by a run whose step counter was never made"
            say("  run stopped before its first update")
            return
        recorded = sorted(g.step for g in h.global_steps)
        unrecorded = h.unrecorded or 0  # applied by a worker killed before its rows were read: said in a note
        say(
            f"  run stopped: global step {step}, {len(recorded)} updates recorded, {unrecorded} without a record"
        )
        assert step == len(recorded) + unrecorded, f"updates lost or counted twice: {step} vs {len(recorded)}"
        assert len(set(recorded)) == len(recorded), "an update recorded twice"
        assert not unrecorded or any(" no record" in n for n in h.notes), "unrecorded updates are said"

    def add(self) -> None:
        if len(self.workers()) >= 3:
            return self.remove()
        try:
            self.cluster.add("worker")
        except TfmagicError as exc:
            self.one_line("add", exc)
        self.remember()

    def remove(self) -> None:
        workers = self.workers()
        if len(workers) <= 1:
            return self.add()
        try:
            self.cluster.remove(workers[-1], drain=self.rng.random() < 0.5)
        except TfmagicError as exc:
            self.one_line("remove", exc)

    def card(self) -> None:
        rate = self.rng.choice(["20mbit", "200mbit", None])
        delay = self.rng.choice(["0ms", "2ms", "20ms"])
        try:
            self.cluster.net("ps:0", rate=rate, delay=delay)
        except TfmagicError as exc:
            self.one_line("net", exc)
        say(f"  ps:0's card: rate {rate}, delay {delay}")

    def kill_relay(self) -> None:
        shaper = self.cluster.shaper
        if shaper is None or not shaper.alive:
            return
        os.kill(shaper.pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (self.cluster.shaper and self.cluster.shaper.alive):
            time.sleep(0.1)
        if not (self.cluster.shaper and self.cluster.shaper.alive):
            try:
                self.cluster.restart_relay()
            except TfmagicError as exc:
                self.one_line("restart_relay", exc)
        self.remember()

    def stop_something(self) -> None:
        """SIGSTOP the relay or a worker for a moment (a machine that froze)."""
        shaper = self.cluster.shaper
        choices = [str(t) for t in self.cluster.tasks("worker")]
        target = self.rng.choice([*choices, "relay"])
        pid = shaper.pid if target == "relay" and shaper is not None else None
        if target != "relay":
            proc = self.cluster.procs[self.cluster.check_task(target)]
            pid = getattr(proc, "task_pid", None) or proc.pid
        if pid is None:
            return
        pause = self.rng.uniform(0.5, 2.0)
        # continued by another process: were this one to freeze on the stopped task (TensorFlow calls
        # that hold the GIL while they wait on every task), it could not continue it itself
        waker = subprocess.Popen(["/bin/sh", "-c", f"sleep {pause:.2f}; kill -CONT {pid}"])
        os.kill(pid, signal.SIGSTOP)
        self.stopped.append(pid)
        t0 = time.monotonic()
        time.sleep(pause)
        froze = time.monotonic() - t0 - pause
        waker.wait()
        self.continue_stopped()
        say(f"  {target} stopped for {pause:.1f} s")
        assert froze < 5, f"this process froze for {froze:.0f} s while {target} was stopped"

    def continue_stopped(self) -> None:
        while self.stopped:
            try:
                os.kill(self.stopped.pop(), signal.SIGCONT)
            except ProcessLookupError:
                pass

    def kill_worker(self) -> None:
        workers = self.workers()
        task = self.rng.choice(workers)
        try:
            self.cluster.kill(task)
            time.sleep(self.rng.uniform(0.2, 1.5))
            self.cluster.restart(task)
        except TfmagicError as exc:
            self.one_line("kill/restart", exc)
        self.remember()

    ACTIONS = {
        "start a run": (start_run, 3),
        "stop the run": (stop_run, 2),
        "add a worker": (add, 2),
        "remove a worker": (remove, 2),
        "change ps:0's card": (card, 2),
        "kill the relay": (kill_relay, 1),
        "stop a process a moment": (stop_something, 2),
        "kill and restart a worker": (kill_worker, 1),
    }

    # -- checks --------------------------------------------------------------------------
    def check_progress(self) -> None:
        run = self.run
        if run is None:
            return
        if not run.running:
            self.check_ended(run)
            self.run = None
            return
        before = run.history.steps
        # A run's first update comes after it connects and traces its step functions (CPU work, which
        # no call waits on): seconds, and more after a relay it connected through was killed, on a
        # loaded machine (a clean-clone run: 10 s at its first action). The stall bound counts from there.
        bound = STALL_S if before > 0 else WARMUP_S
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline and run.running and run.history.steps == before:
            time.sleep(0.2)
        if run.running and run.history.steps == before:
            said = self.cluster.why()
            odd = {t: c for t, c in said.tasks.items() if c != "running"}
            say(f"  no update for {bound:g} s; the doctor: {str(said)[:300]}")
            assert said.rows or odd, f"a run made no update for {bound:g} s and the doctor named nothing"

    def go(self, count: int) -> None:
        names = list(self.ACTIONS)
        weights = [self.ACTIONS[n][1] for n in names]
        self.start_run()
        for i in range(count):
            name = self.rng.choices(names, weights)[0]
            t0 = time.monotonic()
            relay = self.cluster.shaper
            say(f"ACTION {i} {name} (relay {relay.pid if relay else None}, {self.workers()})")
            self.ACTIONS[name][0](self)
            self.check_progress()
            self.actions += 1
            say(f"  took {time.monotonic() - t0:.1f} s")
        if self.run is not None:
            self.stop_run()

    def end(self) -> None:
        self.continue_stopped()
        self.remember()
        self.cluster.stop()
        say("PIDS " + " ".join(str(p) for p in sorted(self.pids)))


def main() -> int:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    faulthandler.dump_traceback_later(float(os.environ.get("FAULT_SOAK_TIMEOUT", "600")), exit=True)
    soak = Soak(seed)
    try:
        soak.go(count)
    finally:
        soak.end()
    say(f"CLEAN seed {seed}: {soak.actions} actions, {soak.runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
