"""``%tf_train`` and ``%tf_dashboard``: train on the cluster, and watch it."""

from __future__ import annotations

import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .. import session
from ..errors import TfmagicError
from . import render
from .verbs import batch_sizes, count, positive, positive_count, seconds, unquote, without_comment


@magics_class
class TrainingMagics(Magics):
    """Training runs and the live dashboard."""

    @property
    def in_notebook(self) -> bool:
        return getattr(self.shell, "kernel", None) is not None

    @magic_arguments()
    @argument(
        "--mode",
        default="sync",
        help="sync | async | ssp (with --staleness) | compare (sync, then async, same start)",
    )
    @argument(
        "--staleness",
        type=count,
        default=None,
        help="ssp: how many steps a worker may run ahead of the slowest",
    )
    @argument(
        "--steps-per-call",
        type=positive_count,
        default=1,
        help="updates per call to the cluster (async; sync without backups)",
    )
    @argument(
        "--events",
        default=None,
        help='scripted events, e.g. "500: slow worker:1 4; 900: kill worker:2; 1300: restart worker:2"',
    )
    @argument(
        "--model",
        default="linear",
        help="linear (y = 2x + 10) | digits (an MLP on the UCI handwritten digits) | the name of a tfmagic.KerasModel variable",
    )
    @argument("--steps", type=positive_count, default=200, help="global updates to apply")
    @argument("--lr", type=positive, default=0.1, help="learning rate (a finite number > 0)")
    @argument(
        "--batch-size",
        type=batch_sizes,
        default=32,
        help="examples per worker step: 32, or each worker its own: worker:0=64,worker:1=16",
    )
    @argument(
        "--backup-workers",
        type=count,
        default=0,
        help="sync: aggregate workers - N gradients per step, drop the late ones",
    )
    @argument(
        "--late",
        default="finish",
        help="with backup workers, a step the update no longer waits for: finish (its gradient dropped, as "
        "SyncReplicasOptimizer) or cancel (it stops, K-sync SGD; paced clusters)",
    )
    @argument("--optimizer", default="sgd", help="sgd | momentum | adagrad")
    @argument("--seed", type=count, default=0, help="initial weights")
    @argument(
        "--logdir", default=None, help="write TensorBoard event files here (one directory per run and task)"
    )
    @argument(
        "--wait", action="store_true", help="block until training ends (default: train in the background)"
    )
    @argument("--no-dashboard", action="store_true", help="do not show the live dashboard")
    @line_magic
    def tf_train(self, line: str = ""):
        """Train a model on the running cluster, sync or async, in the background.

        Examples::

            %tf_train --mode sync --model digits --steps 300
            %tf_train --mode async --optimizer adagrad
            %tf_train --mode compare --backup-workers 1     # sync then async, same start
            run = %tf_train --mode async --steps 2000       # run.history, run.stop(), run.wait()
            model = tfmagic.KerasModel(build_fn, input_fn=input_fn)
            %tf_train --model model --mode async            # a Keras model, by its variable's name

        While it trains the kernel stays free: slow or kill a worker
        (%tf_cluster slow worker:1) and watch what each mode does.
        """
        args = parse_argstring(self.tf_train, without_comment(line))
        cluster = session.default().running()
        if cluster is None:
            raise UsageError(
                "no cluster is running, so there is nothing to train on; start one with %tf_cluster start"
            )
        from .. import training

        opts = dict(
            model=self._model(args.model),
            steps=args.steps,
            lr=args.lr,
            batch_size=args.batch_size,
            backup_workers=args.backup_workers,
            **({"late": args.late} if args.late != "finish" else {}),
            optimizer=args.optimizer,
            seed=args.seed,
            logdir=args.logdir,
            steps_per_call=args.steps_per_call,
            **({"events": unquote(args.events)} if args.events else {}),
        )
        if args.staleness is not None:
            if args.mode != "ssp":
                raise UsageError(
                    "--staleness is for --mode ssp (stale synchronous parallel), e.g. --mode ssp --staleness 2"
                )
            opts["staleness"] = args.staleness
        try:
            if args.mode == "ssp" and args.staleness is None:
                raise UsageError(
                    "--mode ssp needs --staleness N: how many steps a worker may run ahead of the slowest"
                )
            if args.mode == "compare":
                run = training.compare(cluster, block=False, **opts)
            elif args.mode in training.MODES:
                run = training.train(cluster, args.mode, block=False, **opts)
            else:
                raise UsageError(f"unknown mode {args.mode!r}; use sync, async or compare")
        except TfmagicError as exc:
            raise UsageError(render.as_magic(str(exc))) from None
        if not args.no_dashboard:
            run.dashboard = self._show_dashboard(cluster, run, waiting=args.wait)
        if args.wait:
            try:
                run.wait()
            except KeyboardInterrupt:
                run.stop()
                print("Training stopped.", file=sys.stderr)
            except TfmagicError as exc:
                raise UsageError(render.as_magic(str(exc))) from None
        return run

    def _model(self, name: str):
        """A built-in model's name, or the user's KerasModel (any Model) by its variable's name."""
        from ..training.models import BUILTIN, Model

        if name in BUILTIN:
            return name
        value = self.shell.user_ns.get(name)
        if isinstance(value, Model):
            return value
        if value is not None:
            raise UsageError(
                f"{name} is a {type(value).__name__}, not a model; wrap it as "
                f"{name} = tfmagic.KerasModel(build_fn, x=..., y=...) or input_fn=..."
            )
        raise UsageError(
            f"unknown model {name!r}; use {', '.join(BUILTIN)}, or the name of a tfmagic.KerasModel variable"
        )

    def _show_dashboard(self, cluster, run, waiting: bool = False):
        if not self.in_notebook:  # nothing to draw on; a dashboard would only follow the run for nothing
            if not waiting:
                print("Training in the background; run.history.summary() shows where it is.")
            return None
        from ..dashboard import Dashboard

        dash = Dashboard(cluster, runs=[run] if run is not None else [])
        session.default().dashboard = dash
        dash.show()
        return dash

    @magic_arguments()
    @argument("--refresh", type=seconds, default=0.5, help="seconds between frames (0.05 or more)")
    @line_magic
    def tf_dashboard(self, line: str = ""):
        """Show the live dashboard: per-worker throughput, convergence, the cluster.

        It follows the last run started with %tf_train (or tfmagic.train with
        block=False) and the current cluster, refreshing while something trains.
        """
        args = parse_argstring(self.tf_dashboard, without_comment(line))
        if args.refresh < 0.05:
            raise UsageError(
                f"--refresh {args.refresh:g} is too fast: give seconds between frames, 0.05 or more"
            )
        from ..dashboard import Dashboard

        sess = session.default()
        run, cluster = sess.last_run, sess.cluster
        if cluster is None and run is None:
            raise UsageError("nothing to show yet: start a cluster (%tf_cluster start) and train (%tf_train)")
        dash = Dashboard(cluster, runs=[run] if run is not None else [], refresh=args.refresh)
        sess.dashboard = dash
        if self.in_notebook:
            dash.show()
        else:  # no widgets here: the numbers as text, and a way to get the picture
            print(dash.summary())
            print("A picture of it: tfmagic.Dashboard.latest().save('dashboard.png')")
        return None
