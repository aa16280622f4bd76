"""Fidelity: does each classic experiment's claim hold in at least 9 of 10 seeds, within its limits?

Runs every experiment (or the ones named) for each seed, one after another,
and prints per experiment: its main measured ratio for each seed against what
the claim needs, how many seeds held, the longest run and the highest peak
memory (this process and its tasks, PSS), and why the seeds that failed did.  Each line also gives the machine's load average
(1 minute) when that run ended: on a machine shared with other work, a run that
could not keep its pace fails with that reason, and the load says why.

    python bench/fidelity.py                       # all experiments, seeds 0-9 (about an hour)
    python bench/fidelity.py stragglers ssp --seeds 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import tfmagic.experiments as ex


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=ex.names(), help=f"from {', '.join(ex.names())}")
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. N-1 (default 10)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in ex.names()]
    if unknown:
        print(
            f"no experiment named {unknown[0]!r}; the experiments are {', '.join(ex.names())}",
            file=sys.stderr,
        )
        return 2
    t0 = time.monotonic()
    summary = []
    for name in args.names:
        results = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            result = ex.run(
                name, seed=seed, progress=None if args.quiet else lambda s: print("   ", s, flush=True)
            )
            results.append(result)
            figures = "; ".join(
                f"{c.label} {c.value:.3g} (needs {c.op} {c.bound:.3g})" for c in result.checks
            )
            load = os.getloadavg()[0]  # other programs on the machine: a pace missed under load says so
            print(
                f"{name:15s} seed {seed}: {'holds' if result.holds else 'DOES NOT HOLD'}"
                f"  {result.seconds:5.0f} s  {result.peak_memory / 1e9:4.2f} GB  load {load:4.1f}  {figures or '-'}",
                flush=True,
            )
            if not result.holds:
                print(f"{'':15s}   why: {result.why}", flush=True)
            for note in result.notes:
                print(f"{'':15s}   note: {note}", flush=True)
        held = sum(r.holds for r in results)
        line = (
            f"{name:15s} holds in {held}/{len(results)} seeds (needs 9 of 10)"
            f"  longest {max(r.seconds for r in results):.0f} s (limit {ex.TIME_LIMIT:.0f})"
            f"  peak {max(r.peak_memory for r in results) / 1e9:.2f} GB (limit {ex.MEMORY_LIMIT / 1e9:.0f})"
        )
        summary.append(line)
        print(line, flush=True)
    print()
    print(
        f"claim fidelity over seeds {args.first_seed}..{args.first_seed + args.seeds - 1}"
        f" ({time.monotonic() - t0:.0f} s in all):"
    )
    for line in summary:
        print(" ", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
