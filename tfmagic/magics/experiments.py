"""``%tf_experiment``: run one of the classic experiments and show its verdict."""

from __future__ import annotations

import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .. import experiments
from ..errors import TfmagicError
from .verbs import count, positive, without_comment


class Listing:
    """The experiments and their claims (what ``%tf_experiment`` alone shows)."""

    def __init__(self) -> None:
        self.rows = [(name, experiments.claim(name)) for name in experiments.names()]

    def __repr__(self) -> str:
        lines = ["Experiments (%tf_experiment NAME [--seed N]):"]
        lines += [f"  {name:15s} {c.statement}\n  {'':15s} ({c.source})" for name, c in self.rows]
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))

    def _repr_html_(self) -> str:
        import html

        rows = "".join(
            f"<tr><td><code>{html.escape(n)}</code></td><td style='text-align:left'>{html.escape(c.statement)}"
            f"<br/><small>{html.escape(c.source)}</small></td></tr>"
            for n, c in self.rows
        )
        return f"<div><b>Experiments</b> (<code>%tf_experiment NAME [--seed N]</code>)<table>{rows}</table></div>"


@magics_class
class ExperimentMagics(Magics):
    """The classic experiments of distributed training, each checking its published claim."""

    @magic_arguments()
    @argument("name", nargs="?", default=None, help="the experiment (none: list them)")
    @argument("--seed", type=count, default=0, help="seeds the modelled machines, the data and the weights")
    @argument(
        "--memory",
        type=positive,
        default=2.0,
        help="GB this kernel and its tasks may use (at most 2): a phase that would not fit is skipped",
    )
    @line_magic
    def tf_experiment(self, line: str = ""):
        """Run a classic experiment on fresh paced clusters; returns its result (claim, figures, verdict).

        Examples::

            %tf_experiment                         # the experiments and their claims
            %tf_experiment stragglers              # about a minute; progress shows as it runs
            result = %tf_experiment ssp --seed 3   # result.holds, result.measured, result.why

        Each starts and stops its own clusters (at most 150 s, 2 GB); a
        cluster you started stays as it was, though its memory counts.
        """
        args = parse_argstring(self.tf_experiment, without_comment(line))
        if args.name is None:
            return Listing()
        if args.name not in experiments.names():
            raise UsageError(
                f"no experiment named {args.name!r}; the experiments are {', '.join(experiments.names())}"
            )

        limit = experiments.MEMORY_LIMIT / 1000**3
        if args.memory > limit:
            raise UsageError(
                f"--memory is in GB, at most {limit:g} (every experiment keeps to it); for example --memory 1.8"
            )

        def progress(text: str) -> None:
            print(f"{args.name}: {text}", flush=True)

        try:
            return experiments.run(
                args.name, seed=args.seed, progress=progress, memory_limit=args.memory * 1000**3
            )
        except KeyboardInterrupt:
            print(f"{args.name}: interrupted; its clusters are stopped.", file=sys.stderr)
            return None
        except TfmagicError as exc:
            raise UsageError(str(exc)) from None
