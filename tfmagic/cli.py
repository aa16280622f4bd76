"""The ``tfmagic`` command: ``tfmagic demo`` runs the main job end to end; ``tfmagic export``
writes a Slurm script or Kubernetes manifests for the same ps/worker layout elsewhere."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["export"]:
        # Its own parser, whose errors are one line; listed below for `tfmagic --help`.
        from .export.cli import main as export_main

        return export_main(argv[1:])
    parser = argparse.ArgumentParser(prog="tfmagic", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="start a local cluster, train on it, print the results, stop")
    demo.add_argument("--ps", type=int, default=1)
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--steps", type=int, default=300, help="steps of the linear fit")
    demo.add_argument("--train-steps", type=int, default=300, help="updates of each sync/async run")
    demo.add_argument(
        "--plot", default="tfmagic-demo.png", help="where to write the convergence plot (PNG); '' for none"
    )
    sub.add_parser(
        "export",
        add_help=False,
        help="write a Slurm script or Kubernetes manifests for a ps/worker cluster (tfmagic export --help)",
    )
    args = parser.parse_args(argv)
    if args.command == "demo":
        from . import demo as demo_mod
        from .errors import TfmagicError

        try:
            return demo_mod.run(
                ps=args.ps,
                workers=args.workers,
                steps=args.steps,
                plot=args.plot,
                train_steps=args.train_steps,
            )
        except TfmagicError as exc:
            print(f"tfmagic demo: {exc}", file=sys.stderr)
            return 2
    return 2


def entry() -> None:
    """Console-script entry point.

    Everything tfmagic started is already stopped when ``main`` returns; the
    process then ends without running TensorFlow's finalizers, which would
    only print C++ complaints about servers that are (rightly) gone.
    """
    import os

    from .procs import owner

    code = main()
    owner.cleanup()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
