"""``tfmagic export slurm|k8s|tfjob``: the command line of :mod:`tfmagic.export`.

It is a subcommand of ``tfmagic`` (see :mod:`tfmagic.cli`), the one command
line tfmagic has; ``python -m tfmagic.export`` still works and runs this same
:func:`main`, so instructions written for it keep working.  Every error, from
a bad option to a file that exists already, is one line and exit status 2:
the person reading it is at a shell prompt and wants to fix the command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import TfmagicError
from ..spec import ClusterShape
from .files import write_export
from .render import export
from .shape import STRATEGIES

PROG = "tfmagic export"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (and exit status 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ps", type=int, default=1, help="parameter servers (default 1)")
    p.add_argument("--workers", type=int, default=2, help="workers (default 2)")
    p.add_argument("--chief", type=int, default=0, help="0 or 1 chief (default 0)")
    p.add_argument("--strategy", choices=STRATEGIES, default="between-graph")
    p.add_argument("--program", default="train.py", help="the program the workers run (default train.py)")
    p.add_argument("--python", default="python3")
    p.add_argument("--gpus-per-worker", type=int, default=0)
    p.add_argument(
        "-o", "--output", "--out", metavar="FILE", help="write to this file instead of standard output"
    )
    p.add_argument("--force", action="store_true", help="replace FILE if it exists (its mode is kept)")
    p.add_argument("program_args", nargs="*", metavar="ARG", help="arguments for the program, after --")


def _kubernetes(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", required=True, help="container image with TensorFlow and the program")
    p.add_argument("--port", type=int, default=2222, help="port of every task (default 2222)")
    p.add_argument("--name", default="tfmagic", help="prefix of every object name (default tfmagic)")
    p.add_argument("--namespace")


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The argument parser of ``tfmagic export``."""
    top = _Parser(
        prog=prog,
        description="Write a Slurm batch script, Kubernetes manifests or a Kubeflow TFJob for a "
        "ps/worker cluster.",
        epilog="Arguments after '--' are passed to the program. See docs/export.md.",
    )
    sub = top.add_subparsers(dest="command", required=True, metavar="{slurm,k8s,tfjob}", parser_class=_Parser)

    help_text = "a batch script for sbatch (SlurmClusterResolver)"
    p = sub.add_parser("slurm", help=help_text, description=help_text)
    p.set_defaults(kind="slurm")
    _common(p)
    p.add_argument("--port", type=int, default=8888, help="port base (default 8888, TF's)")
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--time", default="01:00:00", help="time limit (default 01:00:00)")
    p.add_argument("--tasks-per-node", type=int)
    p.add_argument("--job-name", default="tfmagic")
    p.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="LINE",
        help="a shell line to run first, e.g. 'module load tensorflow'; repeatable",
    )

    help_text = "a headless Service and a Pod with TF_CONFIG per task"
    p = sub.add_parser("k8s", aliases=["kubernetes"], help=help_text, description=help_text)
    p.set_defaults(kind="kubernetes")
    _common(p)
    _kubernetes(p)
    p.add_argument("--tfjob", action="store_true", help="the same as 'tfjob': one Kubeflow TFJob instead")

    help_text = "one Kubeflow TFJob (the training operator makes the Services and Pods)"
    p = sub.add_parser("tfjob", help=help_text, description=help_text)
    p.set_defaults(kind="tfjob", tfjob=True)
    _common(p)
    _kubernetes(p)
    return top


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """``tfmagic export slurm --ps 1 --workers 2 -o job.sbatch``; returns 0 or exits with status 2."""
    args_parser = parser(prog)
    args = args_parser.parse_args(argv)
    options = {
        "program": args.program,
        "program_args": args.program_args,
        "python": args.python,
        "port": args.port,
        "gpus_per_worker": args.gpus_per_worker,
        "strategy": args.strategy,
    }
    kind = args.kind
    if kind == "slurm":
        options.update(
            partition=args.partition,
            account=args.account,
            time=args.time,
            tasks_per_node=args.tasks_per_node,
            job_name=args.job_name,
            setup=args.setup,
        )
    else:
        options.update(image=args.image, name=args.name, namespace=args.namespace)
        if args.tfjob:
            kind = "tfjob"
    if args.force and not args.output:
        args_parser.error("--force replaces the file given with -o/--out FILE; there is none")
    try:
        shape = ClusterShape(ps=args.ps, workers=args.workers, chief=args.chief)
        if args.output:
            write_export(kind, args.output, shape, force=args.force, **options)
        else:
            sys.stdout.write(export(kind, shape, **options))
    except (TfmagicError, OSError) as exc:
        args_parser.error(str(exc))
    return 0
