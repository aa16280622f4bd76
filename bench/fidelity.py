"""Fidelity: does each classic experiment's claim hold in at least 9 of 10 seeds, within its limits?

Runs every experiment (or the ones named) for each seed, one after another,
and prints per experiment: its main measured ratio for each seed against what
the claim needs, how many seeds held, the longest run and the highest peak
memory (this process and its tasks, PSS), and why the seeds that failed did.  Each line also gives the machine's load average
(1 minute) when that run ended: on a machine shared with other work, a run that
could not keep its pace fails with that reason, and the load says why.

    python bench/fidelity.py                       # all experiments, seeds 0-9 (about an hour)
    python bench/fidelity.py stragglers ssp --seeds 5

Each run is its own Python process, as a notebook's kernel is: forty runs in
one process grew it by about 40 MB a run, over the 2 GB limit at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import tfmagic.experiments as ex


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=ex.names(), help=f"from {', '.join(ex.names())}")
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. N-1 (default 10)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one run, JSON
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in ex.names()]
    if unknown:
        print(
            f"no experiment named {unknown[0]!r}; the experiments are {', '.join(ex.names())}",
            file=sys.stderr,
        )
        return 2
    if args.one:
        return _one(args.names[0], args.first_seed, args.quiet)
    t0 = time.monotonic()
    summary = []
    for name in args.names:
        results = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            result = _run_apart(name, seed, args.quiet)
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


def _one(name: str, seed: int, quiet: bool) -> int:
    result = ex.run(name, seed=seed, progress=None if quiet else lambda s: print("   ", s, flush=True))
    checks = [{"label": c.label, "value": c.value, "op": c.op, "bound": c.bound} for c in result.checks]
    keep = {k: getattr(result, k) for k in ("holds", "seconds", "peak_memory", "why", "notes")}
    print("RESULT " + json.dumps({**keep, "notes": list(result.notes), "checks": checks}), flush=True)
    return 0


def _run_apart(name: str, seed: int, quiet: bool) -> SimpleNamespace:
    """One run in a fresh Python, its progress passed through and its result read back."""
    cmd = [sys.executable, __file__, name, "--first-seed", str(seed), "--one"] + (
        ["--quiet"] if quiet else []
    )
    # TensorFlow's start-up lines, once per run, say nothing
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    found = None
    for line in proc.stdout:
        if line.startswith("RESULT "):
            found = json.loads(line[len("RESULT ") :])
        else:
            print(line, end="", flush=True)
    if proc.wait() != 0 or found is None:
        raise SystemExit(f"{name} seed {seed}: its process ended with {proc.returncode} and no result")
    found["checks"] = [SimpleNamespace(**c) for c in found["checks"]]
    return SimpleNamespace(**found)


if __name__ == "__main__":
    sys.exit(main())
