"""What seeing inside costs, and how fast the hang doctor answers.

1. Traffic measurement: async training throughput with the traffic meter
   sampling (``ss`` once a second) over the same without it, on one cluster,
   in alternating runs (the issue's aim: at least 0.97).
2. The doctor: for scripted hangs, the seconds from the hang's start to a
   correct diagnosis (the doctor reports waits older than its 2 s threshold,
   so about 2 s is the floor), and how long one ``why()`` call takes.

    python bench/inside.py            # about 2 minutes on 2 cores
    python bench/inside.py --only traffic --pairs 8 --steps 1500
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time

import tfmagic
from tfmagic import doctor
from tfmagic.px import run_px

PAIRS = 4
STEPS = 300


def traffic_cost(pairs: int = PAIRS, steps: int = STEPS) -> None:
    with tfmagic.LocalCluster(ps=1, workers=2, spares=False) as c:
        tfmagic.train(c, mode="async", steps=100, model="digits")  # warm: traced, connected
        on, off = [], []
        for i in range(pairs):
            for metered in (True, False) if i % 2 == 0 else (False, True):
                meter = c.traffic_meter() if metered else None
                if not metered and c._meter is not None:
                    c._meter.stop()
                    c._meter = None
                h = tfmagic.train(c, mode="async", steps=steps, model="digits")
                (on if metered else off).append(h.updates_per_s())
                if meter is not None:
                    meter.stop()
                    c._meter = None
        ratios = [a / b for a, b in zip(on, off)]
        print(
            f"traffic meter on / off: median {statistics.median(ratios):.3f} "
            f"(pairs {', '.join(f'{r:.3f}' for r in ratios)}; on {statistics.median(on):.0f}, "
            f"off {statistics.median(off):.0f} updates/s)"
        )


def _time_to(c, predicate, began: float) -> tuple[float, float]:
    calls = []
    while time.time() - began < 15:
        t0 = time.perf_counter()
        diag = c.why()
        calls.append(time.perf_counter() - t0)
        if any(predicate(r) for r in diag.rows) or predicate(diag):
            return time.time() - began, max(calls)
        time.sleep(0.1)
    return float("nan"), max(calls)


def doctor_times() -> None:
    rows = []
    with tfmagic.LocalCluster(ps=1, workers=2, spares=False) as c:
        run_px(c, "1", "worker:*").wait(120)
        # a worker stopped under sync
        run = tfmagic.train(c, mode="sync", steps=100_000, model="digits", block=False)
        while len(run.history.records) < 20:
            time.sleep(0.1)
        pid = c.procs["worker:1"].task_pid
        began = time.time()
        os.kill(pid, signal.SIGSTOP)
        rows.append(
            (
                "worker SIGSTOPped under sync",
                *_time_to(c, lambda r: "stopped" in getattr(r, "cause", ""), began),
            )
        )
        os.kill(pid, signal.SIGCONT)
        run.stop()
        # a %%tf_px cell blocked in one task
        cell = run_px(c, "import time\nif task_index == 1:\n    time.sleep(60)", "worker:*")
        began = time.time()
        rows.append(
            (
                "px cell blocked in worker:1",
                *_time_to(c, lambda r: "tf_px" in getattr(r, "waiter", ""), began),
            )
        )
        cell.interrupt()
        cell.wait(30)
        # a TF1 non-chief without its chief
        code = (
            "with tf.Graph().as_default():\n"
            "    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(cluster=cluster)):\n"
            "        w = tf.compat.v1.get_variable('w_bench', [4])\n"
            "    with tf.compat.v1.train.MonitoredTrainingSession(master=server.target, is_chief=False) as s:\n"
            "        s.run(w)\n"
        )
        cell = run_px(c, code, "worker:1")
        began = time.time()
        rows.append(
            (
                "TF1 program without its chief",
                *_time_to(c, lambda r: "chief" in getattr(r, "cause", ""), began),
            )
        )
        cell.interrupt()
        cell.wait(30)
        # a straggler: slow, not hung (no wait passes the threshold: the task table says it)
        c.slow("worker:0", 8)
        began = time.time()
        rows.append(
            (
                "x8 straggler (slow, not hung)",
                *_time_to(c, lambda d: "not hung" in str(getattr(d, "tasks", "")), began),
            )
        )
        c.slow("worker:0", 1)
    print(f"\nthe hang doctor (threshold {doctor.THRESHOLD:g} s):")
    print(f"  {'hang':34s} {'diagnosed after':>16s} {'slowest why()':>14s}")
    for name, after, call in rows:
        print(f"  {name:34s} {after:14.2f} s {call:12.3f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=PAIRS, help="meter on/off pairs of runs")
    parser.add_argument("--steps", type=int, default=STEPS, help="updates per run")
    parser.add_argument("--only", choices=["traffic", "doctor"], help="one half")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    if args.only != "doctor":
        traffic_cost(args.pairs, args.steps)
    if args.only != "traffic":
        doctor_times()
