"""Whether killing a worker under async training still costs the run a wait, or the process its life
(issue 22, item 11).

    python bench/worker_kill.py [--cycles 60] [--mode async] [--kill-at 50 | --kill-at random]

Each cycle is item 11's scenario: a 600-update run on 1 ps + 3 workers, ``worker:1`` killed once the
run has made 50 updates (about 1.5 s in), the run waited for, the worker restarted. ``--kill-at
random`` kills it at another moment each cycle (seeded, ``--seed``): from before the run's first
connection (0 s after ``train`` returns) to ``--within`` seconds in (3), to meet the races of other
moments. The cycles run in
a child process, as a kernel would: a child that dies (TensorFlow's abort, "Remote address looked up
from remote data found to be poisoned" then "Mutex corrupt", was seen once in 7 such runs in
2026-11) is counted, its last lines printed, and a new child goes on with the cycles left. It prints
a line a cycle (seconds from the kill to the run's end, its error if any) and the totals.

Measured 2026-12-04, 150 cycles: 0 process deaths, every run ended 3.1 to 9.9 s after the kill
(median 4.4 s), none failed, and recorded + the dead worker's lost updates made 600 every time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def child(cycles: int, mode: str, kill_at: str, seed: int, within: float) -> None:
    import random

    import tfmagic

    rng = random.Random(seed)
    with tfmagic.LocalCluster(ps=1, workers=3, spares=False, name="worker-kill") as cluster:
        tfmagic.train(cluster, mode, model="linear", steps=30)
        for _ in range(cycles):
            run = tfmagic.train(cluster, mode, steps=600, block=False)
            t0 = time.monotonic()
            if kill_at == "random":
                time.sleep(rng.uniform(0, within))
            else:
                while run.history.steps < int(kill_at) and run.running and time.monotonic() - t0 < 60:
                    time.sleep(0.01)
            at = time.monotonic() - t0
            cluster.kill("worker:1")
            killed = time.monotonic()
            try:
                run.wait(120)
                error = ""
            except Exception as exc:  # noqa: BLE001 - counted and printed
                error = f"{type(exc).__name__}: {str(exc)[:160]}"
            h = run.history
            print(
                f"cycle: {time.monotonic() - killed:5.1f} s after the kill (at {at:.2f} s), "
                f"{h.steps}+{h.unrecorded} of 600 updates {error}",
                flush=True,
            )
            cluster.restart("worker:1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=60)
    parser.add_argument("--mode", default="async", choices=["async", "sync"])
    parser.add_argument("--kill-at", default="50", help="an update count, or random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--within", type=float, default=3.0, help="--kill-at random: the latest moment, s")
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kill_at != "random" and not args.kill_at.isdigit():
        parser.error("--kill-at takes an update count (50) or random")
    if args.child:
        child(args.child, args.mode, args.kill_at, args.seed, args.within)
        return
    done, deaths, slow, failed = 0, 0, 0, 0
    while done < args.cycles:
        proc = subprocess.Popen(
            [sys.executable, "-u", __file__, "--child", str(args.cycles - done), "--mode", args.mode]
            + ["--kill-at", args.kill_at, "--seed", str(args.seed + done), "--within", str(args.within)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
        tail: list[str] = []
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-40:]
            if line.startswith("cycle:"):
                done += 1
                seconds = float(line.split()[1])
                slow += seconds > 10
                failed += "Error" in line
                print(f"{done:3d} {line[7:].rstrip()}", flush=True)
        if proc.wait() != 0:
            deaths += 1
            print(f"the child died ({proc.returncode}) after {done} cycles; its last lines:", flush=True)
            print("\n".join("    " + t for t in tail if not t.startswith("cycle:")), flush=True)
    print(
        f"{args.cycles} cycles ({args.mode}): {deaths} process deaths, {slow} runs ended over 10 s after "
        f"the kill, {failed} runs failed"
    )


if __name__ == "__main__":
    main()
