"""IPython magics: ``%tf_cluster`` and ``%%tf_device``.

A thin layer: parse the line, call the plain-Python API, render the result.
Bad input becomes one ``UsageError`` line saying what was wrong and what to
do; nothing here changes a running cluster before the input is known good.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from . import owner
from .cluster import LocalCluster, SSHCluster, current_cluster, set_current
from .errors import ClusterStartError, TfmagicError
from .pool import default_pool, parse_bytes
from .procstats import human_bytes, human_seconds, memory_of
from .spec import ClusterShape, TaskName

ACTIONS = ("start", "stop", "status", "logs", "spec", "spares", "slow", "kill", "restart", "attach", "export")
BACKENDS = ("local", "ssh", "spark")


def _placement(cluster) -> tuple:
    """(backend, hosts, master) of a cluster, to tell whether a start asks for the same one."""
    launcher = cluster.launcher
    return (launcher.name, tuple(getattr(launcher, "destinations", ())), getattr(launcher, "master", None))


def _describe(cluster) -> str:
    backend, hosts, master = _placement(cluster)
    where = {"ssh": f" over ssh on {','.join(hosts)}", "spark": f" on Spark {master}"}.get(backend, "")
    if backend == "attached":
        where = ", attached"
    return f"{cluster.shape.describe()}{where}"


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give a count such as 2") from None


class _ShownAbove(Exception):
    """Marks a cell as failed whose own error was already shown above it."""

    def __init__(self, note: str):
        super().__init__(note)
        self.note = note

    def _render_traceback_(self) -> list[str]:
        return [self.note]


class StartProgress:
    """What a notebook shows while a cluster comes up: one row per task."""

    def __init__(self, tasks: list[TaskName]):
        self.rows = {str(t): ("waiting", "") for t in tasks}
        self.t0 = time.monotonic()
        self.title = "starting cluster"

    def update(self, task: str, stage: str, detail: str) -> None:
        if task in self.rows:
            self.rows[task] = (stage, detail)

    def __repr__(self) -> str:
        lines = [f"{self.title} ({time.monotonic() - self.t0:.1f} s)"]
        lines += [f"  {t:10s} {s:9s} {d}" for t, (s, d) in self.rows.items()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        icon = {
            "up": "<span style='color:#1a7f37'>&#10003;</span>",
            "failed": "<span style='color:#cf222e'>&#10007;</span>",
        }
        rows = "".join(
            f"<tr><td>{icon.get(s, '&middot;')}</td><td><code>{html.escape(t)}</code></td>"
            f"<td>{html.escape(s)}</td><td>{html.escape(d)}</td></tr>"
            for t, (s, d) in self.rows.items()
        )
        return (
            f"<div><b>{html.escape(self.title)}</b> ({time.monotonic() - self.t0:.1f} s)"
            f"<table>{rows}</table></div>"
        )


@magics_class
class TfMagics(Magics):
    """``%tf_cluster`` manages the cluster; ``%%tf_device`` runs a cell on one task."""

    @property
    def in_notebook(self) -> bool:
        return getattr(self.shell, "kernel", None) is not None

    # -- %tf_cluster -------------------------------------------------------
    @magic_arguments()
    @argument(
        "action",
        nargs="?",
        default="status",
        help="start | stop | status | logs | spec | spares | slow | kill | restart | attach | export",
    )
    @argument(
        "task",
        nargs="?",
        help="for logs/slow/kill/restart: the task, e.g. worker:1; for spares: a memory budget such as 2GB, "
        "off or auto; for attach: a ClusterSpec or TF_CONFIG as quoted JSON, or a file holding one "
        "(default: $TF_CONFIG); for export: slurm, k8s or tfjob",
    )
    @argument(
        "--backend",
        default=None,
        help="for start: where tasks run: local (default), ssh (needs --hosts) or spark (--master)",
    )
    @argument("--hosts", default=None, help="for --backend ssh: SSH hosts, comma-separated (node1,node2)")
    @argument("--python", default=None, help="for --backend ssh: the Python on the hosts (default python3)")
    @argument("--ssh-config", default=None, help="for --backend ssh: an ssh config file (ssh -F)")
    @argument(
        "--tunnel",
        action="store_true",
        help="for --backend ssh: keep servers on each host's loopback, reached through SSH tunnels",
    )
    @argument("--master", default=None, help="for --backend spark: local[N] or spark://HOST:PORT")
    @argument("--out", default=None, help="for export: write to this file instead of printing")
    @argument(
        "--image",
        default=None,
        help="for export k8s/tfjob: the container image with TensorFlow and your program",
    )
    @argument(
        "--ps",
        type=_count,
        default=None,
        help="number of parameter-server tasks (default 1; 0 for a worker-only cluster)",
    )
    @argument("--workers", type=_count, default=None, help="number of worker tasks (default 2)")
    @argument("--replace", action="store_true", help="stop the running cluster and start this one")
    @argument(
        "--gpus",
        default=None,
        help="CUDA_VISIBLE_DEVICES per worker, separated by '/': '0/1' gives worker:0 GPU 0 and worker:1 GPU 1; ps tasks always get no GPU",
    )
    @argument(
        "--no-spares",
        action="store_true",
        help="spawn every task fresh instead of taking warm spare processes",
    )
    @argument(
        "--timeout", type=float, default=None, help="seconds to wait for every task to come up (default 120)"
    )
    @argument(
        "--collective",
        action="store_true",
        help="all-reduce mode (implies --ps 0): each task creates a MultiWorkerMirroredStrategy, which starts "
        "its server; %%%%tf_px cells find it as `strategy`",
    )
    @argument(
        "--all-interfaces",
        action="store_true",
        help="let task servers listen on every network interface (default: loopback only)",
    )
    @argument("--tail", type=_count, default=50, help="for logs: how many lines (0 for all)")
    @argument(
        "--factor", type=float, default=4.0, help="for slow: run the task at 1/FACTOR speed (1 restores)"
    )
    @line_magic
    def tf_cluster(self, line: str = ""):
        """Start, inspect and stop a TensorFlow cluster (local, over SSH, on Spark, or attached).

        Examples::

            %tf_cluster start --ps 1 --workers 2   # one ps, two workers on this machine
            %tf_cluster status                     # tasks, pids, CPU, memory (PSS/RSS)
            %tf_cluster logs worker:1 --tail 20    # the last lines a task wrote
            %tf_cluster spec                       # ClusterSpec and each task's TF_CONFIG
            %tf_cluster stop                       # stop every task (spares stay warm)
            %tf_cluster spares 1GB                 # memory for warm spares (off, auto)
            %tf_cluster slow worker:1 --factor 4   # a straggler: worker 1 at 1/4 speed (1 restores)
            %tf_cluster kill worker:1              # the task's process dies, as in a crash
            %tf_cluster restart worker:1           # it comes back on its old address
            %tf_cluster start --backend ssh --hosts node1,node2 --python /opt/venv/bin/python
            %tf_cluster start --backend spark --master local[3]
            %tf_cluster attach cluster.json        # a cluster started elsewhere (or $TF_CONFIG)
            %tf_cluster export slurm --out job.sbatch   # also k8s, tfjob

        Then ``%%tf_device worker:1`` runs a cell's ops on a task.
        """
        args = parse_argstring(self.tf_cluster, line)
        if args.action not in ACTIONS:
            raise UsageError(
                f"unknown subcommand {args.action!r}; use one of {', '.join(ACTIONS)} (see %tf_cluster?)"
            )
        try:
            return getattr(self, "_cluster_" + args.action)(args)
        except TfmagicError as exc:
            raise UsageError(str(exc)) from None

    def _need_cluster(self, what: str):
        cluster = current_cluster()
        if cluster is None or not cluster.running:
            raise UsageError(
                f"no cluster is running, so there is nothing to {what}; start one with %tf_cluster start"
            )
        return cluster

    def _cluster_start(self, args):
        if args.collective and args.ps:
            raise UsageError("--collective (all-reduce) has no parameter servers; use --ps 0 --collective")
        shape = ClusterShape(
            ps=(0 if args.collective else 1) if args.ps is None else args.ps,
            workers=2 if args.workers is None else args.workers,
        )
        gpus = args.gpus.split("/") if args.gpus else None
        if gpus is not None and len(gpus) not in (1, shape.workers):
            raise UsageError(
                f"--gpus has {len(gpus)} entries for {shape.workers} workers; "
                "give one per worker separated by '/', or one for all"
            )
        backend = (args.backend or "local").lower()
        if backend not in BACKENDS:
            raise UsageError(f"unknown backend {args.backend!r}; use one of {', '.join(BACKENDS)}")
        if backend != "ssh" and (args.hosts or args.python or args.ssh_config or args.tunnel):
            raise UsageError("--hosts, --python, --ssh-config and --tunnel are for --backend ssh")
        if backend != "spark" and args.master:
            raise UsageError("--master is for --backend spark, e.g. --backend spark --master local[3]")
        if backend == "ssh" and not args.hosts:
            raise UsageError("--backend ssh needs --hosts, e.g. --hosts node1,node2 (names your ssh knows)")
        hosts = tuple(h.strip() for h in (args.hosts or "").split(",") if h.strip())
        master = args.master or (f"local[{shape.size}]" if backend == "spark" else None)
        wanted = (backend, hosts, master)
        running = current_cluster()
        if running is not None and running.running:
            if running.shape == shape and _placement(running) == wanted and not args.replace:
                age = human_seconds(time.time() - (running.started_at or time.time()))
                print(
                    f"Reusing the running cluster {running.name} ({shape.describe()}, up {age}); "
                    "%tf_cluster stop ends it, --replace starts a fresh one."
                )
                return None
            if not args.replace:
                flags = f"--ps {shape.ps} --workers {shape.workers}"
                what = "shape" if running.shape != shape else "placement"
                raise UsageError(
                    f"a cluster of another {what} is running ({_describe(running)}); "
                    f"stop it first (%tf_cluster stop) or replace it: %tf_cluster start {flags} ... --replace"
                )
            running.stop()
            set_current(None)
        common = dict(
            worker_gpus=(gpus[0] if gpus and len(gpus) == 1 else gpus),
            collective=args.collective,
            **({"start_timeout": args.timeout} if args.timeout else {}),
        )
        if backend == "local":
            cluster = LocalCluster(
                ps=shape.ps,
                workers=shape.workers,
                spares=not args.no_spares,
                loopback_only=not args.all_interfaces,
                **common,
            )
        elif backend == "ssh":
            cluster = SSHCluster(
                list(hosts),
                ps=shape.ps,
                workers=shape.workers,
                python=args.python or "python3",
                ssh_config=args.ssh_config,
                tunnel=args.tunnel,
                **common,
            )
        else:
            try:
                from .launchers.spark import SparkCluster
            except ImportError as exc:
                raise UsageError(
                    f"the Spark backend needs pyspark: pip install 'tfmagic[spark]' ({exc})"
                ) from None
            cluster = SparkCluster(master=master, ps=shape.ps, workers=shape.workers, **common)
        view = StartProgress(shape.tasks())
        handle = display(view, display_id=True) if self.in_notebook else None

        def progress(task: str, stage: str, detail: str) -> None:
            view.update(task, stage, detail)
            if handle is not None:
                handle.update(view)
            else:
                print(f"  {task:10s} {stage:9s} {detail}", flush=True)

        try:
            outcome = cluster.start(progress=progress)
        except ClusterStartError as exc:
            view.title = "cluster failed to start"
            if exc.task:
                view.update(exc.task, "failed", "see below")
            if handle is not None:
                handle.update(view)
            if exc.log_tail:
                print(f"--- last lines of {exc.task}'s log ---\n{exc.log_tail}", file=sys.stderr)
            raise UsageError(str(exc)) from None
        except KeyboardInterrupt:
            print("Start interrupted; the tasks started so far were stopped.", file=sys.stderr)
            return None
        set_current(cluster)
        view.title = f"cluster {cluster.name} is up"
        if handle is not None:
            handle.update(view)
        how = f"{outcome.warm} warm spare{'s' if outcome.warm != 1 else ''}, {outcome.cold} new"
        print(
            f"Cluster {cluster.name} started: {shape.describe()} in {outcome.seconds:.1f} s ({how}). "
            + (
                "Use %%tf_px: every task has a MultiWorkerMirroredStrategy ready as `strategy`."
                if cluster.collective
                else "Use %%tf_device worker:0 to run a cell there."
            )
        )
        print(
            f"Security: {cluster.launcher.security_note()}; once connected, this kernel also "
            "serves TensorFlow on every interface. See the README's Security section."
        )
        for task, proc in cluster.procs.items():
            if getattr(proc, "guard_failed", None):
                print(
                    f"Warning: {task} on {proc.destination or proc.host}: {proc.guard_failed}.",
                    file=sys.stderr,
                )
        return None

    def _cluster_export(self, args):
        from .export import export, write_export

        kind = {"k8s": "kubernetes", "kube": "kubernetes"}.get(
            (args.task or "").lower(), (args.task or "").lower()
        )
        if kind not in ("slurm", "kubernetes", "tfjob"):
            raise UsageError("export needs what to write: %tf_cluster export slurm|k8s|tfjob [--out FILE]")
        options = {}
        if kind != "slurm":
            if not args.image:
                raise UsageError(
                    f"export {args.task} needs --image, the container image holding TensorFlow and your program"
                )
            options["image"] = args.image
        running = current_cluster()
        if args.ps is not None or args.workers is not None or running is None or not running.running:
            shape = ClusterShape(
                ps=1 if args.ps is None else args.ps, workers=2 if args.workers is None else args.workers
            )
        else:
            shape = running.shape
        if args.out:
            path = write_export(kind, args.out, shape, **options)
            print(f"Wrote {path} ({kind}, {shape.describe()}); see docs/export.md for how to run it.")
        else:
            print(export(kind, shape, **options))

    def _cluster_attach(self, args):
        import os

        from .attach import attach

        spec = args.task or os.environ.get("TF_CONFIG")
        if spec and len(spec) > 1 and spec[0] == spec[-1] and spec[0] in "'\"":
            spec = spec[1:-1]  # IPython keeps the quotes around one quoted argument
        if not spec:
            raise UsageError(
                "attach needs the cluster: %tf_cluster attach cluster.json, or a quoted ClusterSpec/TF_CONFIG "
                "JSON, or set TF_CONFIG"
            )
        running = current_cluster()
        if running is not None and running.running:
            raise UsageError(
                f"a cluster is running ({_describe(running)}); stop it first (%tf_cluster stop), then attach"
            )
        cluster = attach(spec)
        set_current(cluster)
        print(
            f"Attached to cluster {cluster.name} ({cluster.shape.describe()}): "
            + ", ".join(f"{t} {cluster.address(t)}" for t in cluster.procs)
            + ". tfmagic did not start these tasks: %tf_cluster stop only detaches, and slow, kill and restart "
            "are not available. %%tf_device worker:0 runs a cell there."
        )
        print(f"Security: {cluster.launcher.security_note()}.")

    def _cluster_stop(self, args):
        cluster = current_cluster()
        if cluster is None or not cluster.running:
            raise UsageError(
                "no cluster is running, so there is nothing to stop; start one with %tf_cluster start"
            )
        n = len(cluster.procs)
        cluster.stop()
        if cluster.launcher.name == "attached":
            set_current(None)
            print(
                f"Detached from cluster {cluster.name}; its {n} tasks keep running (tfmagic did not start them)."
            )
            return
        spares = default_pool().processes()
        print(
            f"Stopped cluster {cluster.name} ({n} tasks). "
            f"{len(spares)} warm spare process{'es' if len(spares) != 1 else ''} kept for the next start"
            + (" (%tf_cluster spares off frees them)." if spares else ".")
        )

    def _cluster_status(self, args):
        cluster = current_cluster()
        if cluster is None:
            spares = default_pool().processes()
            print(f"No cluster is running ({len(spares)} warm spares); start one with %tf_cluster start.")
            return
        display(cluster.status())

    def _cluster_logs(self, args):
        if not args.task:
            raise UsageError("logs needs a task, for example: %tf_cluster logs worker:1 --tail 20")
        if args.task in ("kernel", "client"):
            path = owner.runtime_dir() / "kernel-native.log"
            from .launchers.local import read_tail

            print(read_tail(str(path), args.tail or None) or f"(nothing logged yet in {path})")
            return
        cluster = self._need_cluster("show logs of")
        task = cluster.check_task(args.task)
        print(cluster.logs(task, tail=args.tail or None))

    def _task_arg(self, args, what: str):
        if not args.task:
            raise UsageError(f"{what} needs a task, for example: %tf_cluster {what} worker:1")
        cluster = self._need_cluster(what)
        return cluster, cluster.check_task(args.task)

    def _cluster_slow(self, args):
        cluster, task = self._task_arg(args, "slow")
        try:
            cluster.slow(task, args.factor)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.factor > 1:
            print(
                f"{task} now runs at 1/{args.factor:g} speed; %tf_cluster slow {task} --factor 1 restores it."
            )
        else:
            print(f"{task} runs at full speed again.")

    def _cluster_kill(self, args):
        cluster, task = self._task_arg(args, "kill")
        pid = cluster.procs[task].pid
        cluster.kill(task)
        print(f"Killed {task} (pid {pid}). %tf_cluster restart {task} brings it back.")

    def _cluster_restart(self, args):
        cluster, task = self._task_arg(args, "restart")
        try:
            outcome = cluster.restart(task)
        except ClusterStartError as exc:
            if exc.log_tail:
                print(f"--- last lines of {exc.task}'s log ---\n{exc.log_tail}", file=sys.stderr)
            raise UsageError(str(exc)) from None
        how = "a warm spare" if outcome.warm else "a new process"
        print(
            f"Restarted {task} on {cluster.address(task)} in {outcome.seconds:.2f} s ({how}, pid {cluster.procs[task].pid})."
        )

    def _cluster_spec(self, args):
        cluster = self._need_cluster("describe")
        defn = cluster.cluster_def
        print("ClusterSpec:")
        print(json.dumps(defn.as_dict(), indent=2))
        for task in defn.tasks():
            print(f"TF_CONFIG for {task}:")
            print(json.dumps(defn.tf_config(task)))

    def _cluster_spares(self, args):
        pool = default_pool()
        if args.task:
            try:
                parse_bytes(args.task)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            pool.set_budget(args.task)
        spares = pool.processes()
        print(
            f"Spare budget {human_bytes(pool.budget)}; {len(spares)} warm spare process"
            f"{'es' if len(spares) != 1 else ''} ({human_bytes(sum((memory_of(p.pid) or {}).get('pss', 0) for p in spares))} PSS)."
        )

    # -- %tf_train -----------------------------------------------------------
    @magic_arguments()
    @argument("--mode", default="sync", help="sync | async | compare (sync, then async, from the same start)")
    @argument(
        "--model",
        default="linear",
        help="linear (y = 2x + 10) | digits (MLP on scikit-learn's digits) | the name of a tfmagic.KerasModel variable",
    )
    @argument("--steps", type=_count, default=200, help="global updates to apply")
    @argument("--lr", type=float, default=0.1, help="learning rate")
    @argument("--batch-size", type=_count, default=32, help="examples per worker step")
    @argument(
        "--backup-workers",
        type=_count,
        default=0,
        help="sync: aggregate workers - N gradients per step, drop the late ones",
    )
    @argument("--optimizer", default="sgd", help="sgd | momentum | adagrad")
    @argument("--seed", type=int, default=0, help="initial weights")
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
        args = parse_argstring(self.tf_train, line)
        cluster = self._need_cluster("train on")
        from . import training

        opts = dict(
            model=self._model(args.model),
            steps=args.steps,
            lr=args.lr,
            batch_size=args.batch_size,
            backup_workers=args.backup_workers,
            optimizer=args.optimizer,
            seed=args.seed,
            logdir=args.logdir,
        )
        try:
            if args.mode == "compare":
                run = training.compare(cluster, block=False, **opts)
            elif args.mode in training.MODES:
                run = training.train(cluster, args.mode, block=False, **opts)
            else:
                raise UsageError(f"unknown mode {args.mode!r}; use sync, async or compare")
        except TfmagicError as exc:
            raise UsageError(str(exc)) from None
        training.set_last_run(run)
        if not args.no_dashboard:
            run.dashboard = self._show_dashboard(cluster, run, waiting=args.wait)
        if args.wait:
            try:
                run.wait()
            except KeyboardInterrupt:
                run.stop()
                print("Training stopped.", file=sys.stderr)
            except TfmagicError as exc:
                raise UsageError(str(exc)) from None
        return run

    def _model(self, name: str):
        """A built-in model's name, or the user's KerasModel (any Model) by its variable's name."""
        from .training.models import BUILTIN, Model

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
        from .dashboard import Dashboard

        dash = Dashboard(cluster, runs=[run] if run is not None else [])
        if self.in_notebook:
            dash.show()
        elif not waiting:
            print("Training in the background; run.history.summary() shows where it is.")
        return dash

    @magic_arguments()
    @argument("--refresh", type=float, default=0.5, help="seconds between frames")
    @line_magic
    def tf_dashboard(self, line: str = ""):
        """Show the live dashboard: per-worker throughput, convergence, the cluster.

        It follows the last run started with %tf_train (or tfmagic.train with
        block=False, registered via tfmagic.training.set_last_run) and the
        current cluster, refreshing while something trains.
        """
        args = parse_argstring(self.tf_dashboard, line)
        if args.refresh < 0.05:
            raise UsageError(
                f"--refresh {args.refresh:g} is too fast: give seconds between frames, 0.05 or more"
            )
        from . import training
        from .dashboard import Dashboard

        run = training.last_run()
        cluster = current_cluster()
        if cluster is None and run is None:
            raise UsageError("nothing to show yet: start a cluster (%tf_cluster start) and train (%tf_train)")
        dash = Dashboard(cluster, runs=[run] if run is not None else [], refresh=args.refresh)
        if self.in_notebook:
            dash.show()
        else:  # no widgets here: the numbers as text, and a way to get the picture
            print(dash.summary())
            print("A picture of it: tfmagic.Dashboard.latest().save('dashboard.png')")
        return None

    # -- %%tf_px --------------------------------------------------------------
    @magic_arguments()
    @argument(
        "--targets", default="all", help="all (default), worker:*, ps:*, or tasks such as ps:0,worker:1"
    )
    @argument(
        "--noblock", action="store_true", help="return a handle at once (.wait(), .interrupt(), .results)"
    )
    @argument(
        "-o",
        dest="output",
        default=None,
        help="bind {task: value of the cell's last expression} to this name",
    )
    @cell_magic
    def tf_px(self, line: str, cell: str):
        """Run the cell's Python code inside every targeted task (between-graph replication).

        Each task has, ready in a namespace that persists from cell to cell:
        ``cluster`` (a tf.train.ClusterSpec), ``job_name``, ``task_index``,
        ``server`` (the task's running server: ``server.target`` works as in
        the seeds), ``TF_CONFIG`` (also in os.environ), ``tf`` and
        ``report(step=..., loss=...)`` to feed tfmagic's metrics and dashboard.

        Examples::

            %%tf_px --targets worker:*
            print(job_name, task_index, server.target)

            %%tf_px -o losses
            final_loss          # -> losses == {"ps:0": ..., "worker:0": ..., ...}

        Output streams back while the cell runs, each line prefixed with its
        task.  Interrupting the kernel interrupts the tasks' cells.
        """
        args = parse_argstring(self.tf_px, line)
        cluster = self._need_cluster("run a cell in")
        from .px import PxError, run_px

        try:
            run = run_px(cluster, cell, args.targets)
        except (PxError, TfmagicError) as exc:
            raise UsageError(str(exc)) from None
        if args.noblock:
            if args.output:
                self.shell.user_ns[args.output] = run.results
            return run
        failed = self._follow_px(run)
        if args.output:
            self.shell.user_ns[args.output] = run.results
        if failed:
            raise _ShownAbove(f"(%%tf_px: {', '.join(failed)}; the other tasks' output is above)")
        return None

    def _follow_px(self, run) -> list[str]:
        """Print the tasks' output as it arrives; returns what went wrong, per task."""
        if run.importing:
            print(
                f"({', '.join(run.importing)}: importing TensorFlow's Python API for a first cell, "
                "a few seconds; the servers did not need it)",
                file=sys.stderr,
            )
        # While we wait here a kernel interrupt only sets a flag. Raised as KeyboardInterrupt at
        # any bytecode, it can land inside the event queue's locking and leave its lock held; the
        # tasks' reader threads and this loop then wait forever. A full test run once hung just
        # after an interrupt in a way that fits this.
        sigint = [False]
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, lambda signum, frame: sigint.__setitem__(0, True))
        try:
            self._follow_px_events(run, sigint)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        failed = []
        for task, outcome in run.outcomes.items():
            if outcome.status == "error":
                failed.append(f"{task} raised {outcome.ename}")
            elif outcome.status == "died":
                failed.append(f"{task} died")
            elif outcome.status == "interrupted":
                failed.append(f"{task} interrupted")
            elif outcome.status == "running":
                failed.append(f"{task} still running")
        return failed

    @staticmethod
    def _follow_px_events(run, sigint: list) -> None:
        import queue as _queue

        interrupted_at = None
        while True:
            if sigint[0] and interrupted_at is None:
                run.interrupt()
                interrupted_at = time.monotonic()
                print("Interrupting the tasks' cells ...", file=sys.stderr)
            try:
                task, kind, payload = run.events.get(timeout=0.1)
            except _queue.Empty:
                if run.done and run.events.empty():
                    break
                if interrupted_at is not None and time.monotonic() - interrupted_at > 10:
                    print(
                        "Some tasks did not stop within 10 s of the interrupt; they go on in the background.",
                        file=sys.stderr,
                    )
                    break
                continue
            if kind == "stream":
                name, text = payload
                stream = sys.stderr if name == "stderr" else sys.stdout
                for piece in text.splitlines(True):
                    stream.write(f"[{task}] {piece}")
                stream.flush()
            elif kind in ("error", "interrupted"):
                print(
                    "".join(f"[{task}] {ln}" for ln in "".join(payload.traceback).splitlines(True)),
                    file=sys.stderr,
                    end="",
                )
            elif kind == "died":
                detail = payload.evalue if hasattr(payload, "evalue") else payload
                print(f"[{task}] {detail}; see %tf_cluster logs {task}", file=sys.stderr)

    # -- %%tf_device ---------------------------------------------------------
    @cell_magic
    def tf_device(self, line: str, cell: str):
        """Run the cell with its TensorFlow ops placed on one task of the cluster.

        Usage::

            %%tf_device ps:0
            w = tf.Variable(0.0)        # the variable lives on the ps

            %%tf_device worker:1        # also /job:worker/task:1
            y = w * 2.0                 # computed on worker 1

        The kernel is the client; the cell's Python runs here, its ops there.
        Interrupt the kernel to stop waiting on a task that does not answer.
        """
        spec = line.strip()
        if not spec:
            raise UsageError("%%tf_device needs a task, for example: %%tf_device worker:1")
        cluster = current_cluster()
        if cluster is None or not cluster.running:
            raise UsageError(
                f"no cluster is running, so there is no {spec} to run on; start one with %tf_cluster start"
            )
        try:
            task = cluster.check_task(spec)
            cluster.connect()
        except TfmagicError as exc:
            raise UsageError(str(exc)) from None
        return self._run_on(cluster, task, cell)

    def _run_on(self, cluster, task: TaskName, cell: str):
        box: dict = {}

        def body() -> None:
            try:
                with cluster.device(task):
                    box["result"] = self.shell.run_cell(cell, store_history=False)
            except BaseException as exc:  # noqa: BLE001 - reported on the main thread
                box["error"] = exc

        # The cell runs on a helper thread so that a kernel interrupt reaches
        # this (main) thread even while TensorFlow blocks inside C++ waiting
        # for a task: the wait is abandoned and the kernel stays usable.
        worker = threading.Thread(target=body, name=f"tfmagic-cell-{task}", daemon=True)
        t0 = time.monotonic()
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.1)
        except KeyboardInterrupt:
            waited = time.monotonic() - t0
            raise _ShownAbove(
                f"Interrupted: the cell waited {waited:.1f} s on {task} and was left running in the "
                f"background. Ops on {task} queue behind it until it ends; "
                f"%tf_cluster stop (or restarting {task}) ends it. The kernel is free."
            ) from None
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, TfmagicError):
                raise UsageError(str(exc)) from None
            raise exc
        result = box.get("result")
        if result is not None and not result.success:
            raise _ShownAbove(f"(the cell failed on {task}; its error is shown above)")
        return None


_filter = None


def load(ipython) -> None:
    """Register the magics and keep TensorFlow's C++ log lines out of the notebook."""
    global _filter
    ipython.register_magics(TfMagics)
    default_pool().reopen()
    import os

    if os.environ.get("TFMAGIC_SHOW_TF_LOGS", "") not in ("1", "true", "yes"):
        try:
            from . import logfilter

            _filter = logfilter.install(owner.runtime_dir() / "kernel-native.log")
        except Exception as exc:  # noqa: BLE001 - the filter is a comfort, never a blocker
            print(f"tfmagic: TensorFlow's native logs will show here ({exc})", file=sys.stderr)


def unload(ipython) -> None:
    """Stop the cluster and every spare this kernel started; restore stderr."""
    global _filter
    killed = len(owner.processes())
    cluster = current_cluster()
    if cluster is not None:
        cluster.close()
        set_current(None)
    default_pool().shutdown()
    owner.kill_all()
    if _filter is not None:
        from . import logfilter

        logfilter.uninstall()
        _filter = None
    if killed:
        print(f"tfmagic: stopped {killed} process{'es' if killed != 1 else ''}.")
