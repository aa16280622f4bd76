"""``%tf_cluster``: start, inspect, break on purpose and stop a cluster."""

from __future__ import annotations

import json
import os
import shlex
import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display

from .. import session
from ..backends import BACKENDS, ClusterRequest, check
from ..errors import ClusterRunning, ClusterStartError, TfmagicError
from ..pool import default_pool
from ..procs import owner
from ..procs.stats import memory_of
from ..spec import ClusterShape
from ..units import human_bytes, parse_bytes
from . import render
from .verbs import Verbs, arg, count, number, positive_count, seconds, unquote, verb


def _need_cluster(what: str):
    cluster = session.default().running()
    if cluster is None:
        raise UsageError(
            f"no cluster is running, so there is nothing to {what}; start one with %tf_cluster start"
        )
    return cluster


def _task(cluster, text: str | None, what: str):
    if not text:
        raise UsageError(f"{what} needs a task, for example: %tf_cluster {what} worker:1")
    try:
        return cluster.check_task(unquote(text))
    except TfmagicError as exc:
        raise UsageError(render.as_magic(str(exc))) from None


def _running_message(exc: ClusterRunning, shape) -> str:
    flags = f"--ps {shape.ps} --workers {shape.workers}"
    return (
        f"a cluster of another {exc.what} is running ({exc.running.describe()}); "
        f"stop it first (%tf_cluster stop) or replace it: %tf_cluster start {flags} ... --replace"
    )


def _request(args) -> ClusterRequest:
    """The start request the options of ``%tf_cluster start`` make, or a UsageError saying what is wrong."""
    if args.collective and args.ps:
        raise UsageError("--collective (all-reduce) has no parameter servers; use --ps 0 --collective")
    backend = args.backend.lower()
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {args.backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "ssh" and not args.hosts:
        raise UsageError("--backend ssh needs --hosts, e.g. --hosts node1,node2 (names your ssh knows)")
    if backend != "ssh" and (args.hosts or args.ssh_config or args.tunnel):
        raise UsageError("--hosts, --ssh-config and --tunnel are for --backend ssh")
    if backend not in ("ssh", "slurm") and args.python:
        raise UsageError("--python is for --backend ssh or slurm (the Python the hosts or nodes run)")
    slurm_given = [
        f"--{n.replace('_', '-')}"
        for n in ("partition", "time", "account", "sbatch", "worker_sbatch")
        if getattr(args, n)
    ]
    if backend != "slurm" and slurm_given:
        raise UsageError(
            f"{', '.join(slurm_given)} {'is' if len(slurm_given) == 1 else 'are'} for --backend slurm"
        )
    if backend != "spark" and args.master:
        raise UsageError("--master is for --backend spark, e.g. --backend spark --master local[3]")
    request = ClusterRequest(
        ps=(0 if args.collective else 1) if args.ps is None else args.ps,
        workers=2 if args.workers is None else args.workers,
        backend=backend,
        collective=args.collective,
        gpus=tuple(args.gpus.split("/")) if args.gpus else (),
        spares=not args.no_spares,
        loopback_only=not args.all_interfaces,
        timeout=args.timeout,
        hosts=tuple(h.strip() for h in (args.hosts or "").split(",") if h.strip()),
        python=args.python,
        ssh_config=args.ssh_config,
        tunnel=args.tunnel,
        master=args.master,
        partition=args.partition,
        walltime=args.time,
        account=args.account,
        sbatch=tuple(shlex.split(unquote(args.sbatch))) if args.sbatch else (),
        worker_sbatch=tuple(shlex.split(unquote(args.worker_sbatch))) if args.worker_sbatch else (),
        pace=args.pace,
        jitter=_jitter(args.jitter),
        net=unquote(args.net) if args.net else None,
        processes=args.processes,
    )
    try:
        shape = request.shape
    except TfmagicError as exc:
        raise UsageError(str(exc)) from None
    if request.gpus and len(request.gpus) not in (1, shape.workers):
        raise UsageError(
            f"--gpus has {len(request.gpus)} entries for {shape.workers} workers; "
            "give one per worker separated by '/', or one for all"
        )
    return request


@magics_class
class ClusterMagics(Magics):
    """``%tf_cluster VERB``: the cluster's life, one verb each."""

    @property
    def in_notebook(self) -> bool:
        return getattr(self.shell, "kernel", None) is not None

    @line_magic
    def tf_cluster(self, line: str = ""):
        """Start, inspect and stop a TensorFlow cluster (local, over SSH, on Spark, or attached).

        Examples::

            %tf_cluster start --ps 1 --workers 2   # one ps, two workers on this machine
            %tf_cluster status                     # tasks, pids, CPU, memory (PSS/RSS)
            %tf_cluster logs worker:1 --tail 20    # the last lines a task wrote
            %tf_cluster slow worker:1 --factor 4   # a straggler: worker 1 at 1/4 speed (1 restores)
            %tf_cluster kill worker:1              # the task's process dies, as in a crash
            %tf_cluster restart worker:1           # it comes back on its old address
            %tf_cluster stop                       # stop every task (spares stay warm)

        Then ``%%tf_device worker:1`` runs a cell's ops on a task.
        """
        try:
            return VERBS.run(self, line)
        except TfmagicError as exc:
            raise UsageError(render.as_magic(str(exc))) from None

    # -- start and stop -------------------------------------------------------
    @verb("start a cluster; the same shape again reuses it, another shape needs --replace")
    @arg(
        "--ps",
        type=count,
        default=None,
        help="parameter-server tasks (default 1; 0 for a worker-only cluster)",
    )
    @arg("--workers", type=count, default=None, help="worker tasks (default 2)")
    @arg("--backend", default="local", help=f"where tasks run: {', '.join(BACKENDS)}")
    @arg("--replace", action="store_true", help="stop the running cluster and start this one")
    @arg("--gpus", default=None, help="CUDA_VISIBLE_DEVICES per worker, '/'-separated ('0/1'); ps get none")
    @arg("--no-spares", action="store_true", help="spawn every task fresh instead of taking warm spares")
    @arg("--timeout", type=seconds, default=None, help="seconds to wait for every task (default 120)")
    @arg(
        "--collective",
        action="store_true",
        help="all-reduce mode (implies --ps 0): `strategy` in %%%%tf_px cells",
    )
    @arg("--all-interfaces", action="store_true", help="let task servers listen on every interface")
    @arg(
        "--processes",
        default=None,
        help="put the tasks in this many processes, or 'auto' (one per 16 tasks): 2 ps and 32 workers "
        "in 2 GB; each task stays a server of its own (local backend)",
    )
    @arg(
        "--pace",
        default=None,
        help="model each worker as a machine whose training step takes this long (40ms), or 'auto' (the "
        "smallest this machine keeps, measured now): a cluster in miniature that behaves like separate "
        "machines however many processes share the cores",
    )
    @arg(
        "--jitter",
        default=None,
        help="with --pace: spread each step's time (its log standard deviation; 0.1 is about +-10 %%), so "
        "that workers' steps rarely end at the same instant, as on real machines",
    )
    @arg(
        "--net",
        default=None,
        help='a modelled network for some tasks: "ps:0 rate=100mbit delay=2ms" (a card; ps:* for every ps), '
        '"worker:0->ps:0 rate=10mbit" (a link), "ps:*" (a relay, no limit yet); ";" between entries; '
        "rates and delays then change live with %%%%tf_cluster net",
    )
    @arg("--hosts", default=None, help="ssh: hosts, comma-separated (node1,node2)")
    @arg("--python", default=None, help="ssh, slurm: the Python on the hosts or nodes (ssh: python3)")
    @arg("--ssh-config", default=None, help="ssh: an ssh config file (ssh -F)")
    @arg(
        "--tunnel",
        action="store_true",
        help="ssh: servers on each host's loopback, reached through SSH tunnels",
    )
    @arg("--master", default=None, help="spark: local[N] or spark://HOST:PORT")
    @arg("--partition", default=None, help="slurm: the partition (sbatch --partition)")
    @arg("--time", default=None, help="slurm: the job's time limit, 1:00:00 (sbatch --time)")
    @arg("--account", default=None, help="slurm: the account to charge (sbatch --account)")
    @arg("--sbatch", default=None, help='slurm: more sbatch options, quoted: "--qos=debug"')
    @arg(
        "--worker-sbatch",
        default=None,
        help='slurm: options for the workers only, quoted: "--gpus-per-task=1" (they run as a job of their own)',
    )
    def cmd_start(self, args):
        request = _request(args)
        shape = request.shape
        try:  # what can be checked without a process, before any progress is shown
            check(request)
        except TfmagicError as exc:
            raise UsageError(render.as_magic(str(exc))) from None
        sess = session.default()
        try:
            if sess.running() is not None and not args.replace:
                cluster, outcome = sess.start(request)  # reuses, or raises ClusterRunning
                print(render.started(cluster, outcome))
                _measure_pace(cluster)
                return None
        except ClusterRunning as exc:
            raise UsageError(_running_message(exc, shape)) from None
        view = render.StartProgress(shape.tasks())
        handle = display(view, display_id=True) if self.in_notebook else None

        def progress(task: str, stage: str, detail: str) -> None:
            view.update(task, stage, detail)
            if handle is not None:
                handle.update(view)
            else:
                print(f"  {task:10s} {stage:9s} {detail}", flush=True)

        try:
            cluster, outcome = sess.start(request, replace=args.replace, progress=progress)
        except ClusterRunning as exc:  # another start came first
            if handle is not None:
                handle.update(render.Cleared())
            raise UsageError(_running_message(exc, shape)) from None
        except ClusterStartError as exc:
            view.title = "cluster failed to start"
            if exc.task:
                view.update(exc.task, "failed", "see below")
            if handle is not None:
                handle.update(view)
            if exc.log_tail:
                print(f"--- last lines of {exc.task}'s log ---\n{exc.log_tail}", file=sys.stderr)
            raise UsageError(render.as_magic(str(exc))) from None
        except KeyboardInterrupt:
            print("Start interrupted; the tasks started so far were stopped.", file=sys.stderr)
            return None
        view.title = f"cluster {cluster.name} is up"
        if handle is not None:
            handle.update(view)
        print(render.started(cluster, outcome))
        _measure_pace(cluster)
        said = render.security_once(cluster)
        if said:
            print(said)
        for task, proc in cluster.procs.items():
            if getattr(proc, "guard_failed", None):
                print(
                    f"Warning: {task} on {proc.destination or proc.host}: {proc.guard_failed}.",
                    file=sys.stderr,
                )
        return None

    @verb("stop every task (warm spares stay for the next start); an attached cluster is only let go")
    def cmd_stop(self, args):
        cluster = _need_cluster("stop")
        n = len(cluster.procs)
        session.default().stop()
        if cluster.launcher.name == "attached":
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

    @verb("attach to a cluster started elsewhere: a ClusterSpec/TF_CONFIG as JSON, a file, or $TF_CONFIG")
    @arg("spec", nargs="?", default=None, help="quoted JSON or a file (default: $TF_CONFIG)")
    def cmd_attach(self, args):
        from ..attached import AttachedCluster

        spec = unquote(args.spec) if args.spec else os.environ.get("TF_CONFIG")
        if not spec:
            raise UsageError(
                "attach needs the cluster: %tf_cluster attach cluster.json, or a quoted ClusterSpec/TF_CONFIG "
                "JSON, or set TF_CONFIG"
            )
        cluster = AttachedCluster(spec)  # reads and checks the description first: bad input says so
        running = session.default().running()
        if running is not None:
            raise UsageError(
                f"a cluster is running ({running.describe()}); stop it first (%tf_cluster stop), then attach"
            )
        cluster.start()
        session.default().adopt(cluster)
        print(
            f"Attached to cluster {cluster.name} ({cluster.shape.describe()}): "
            + ", ".join(f"{t} {cluster.address(t)}" for t in cluster.procs)
            + ". tfmagic did not start these tasks: %tf_cluster stop only detaches, and slow, kill and restart "
            "are not available. %%tf_device worker:0 runs a cell there."
        )
        print(render.security(cluster))

    # -- looking ---------------------------------------------------------------
    @verb("each task: address, pid, state, CPU, memory (PSS beside RSS), uptime; warm spares")
    def cmd_status(self, args):
        cluster = session.default().cluster
        if cluster is None:
            spares = default_pool().processes()
            print(f"No cluster is running ({len(spares)} warm spares); start one with %tf_cluster start.")
            return
        display(cluster.status())

    @verb("where every variable lives: per task, with each ps's share of the bytes (a picture in a notebook)")
    def cmd_map(self, args):
        cluster = _need_cluster("map")
        run = session.default().last_run
        runs = getattr(run, "runs", None) or [run]
        mine = [
            r
            for r in runs
            if r is not None and getattr(r, "cluster", None) is cluster and hasattr(r, "history")
        ]
        display(cluster.placement(run=mine[-1] if mine else None))

    @verb("who waits on whom, since when and why (dead, stopped, slowed, not answering), with the next step")
    @arg("--stacks", action="store_true", help="also the Python stacks of every task's threads")
    def cmd_why(self, args):
        cluster = session.default().cluster
        if cluster is None:
            raise UsageError(
                "no cluster has been started, so nothing waits on one; start one with %tf_cluster start"
            )
        display(cluster.why(stacks=args.stacks))

    @verb("bytes moved over every link (kernel and tasks) since the cluster started, measured by the OS")
    def cmd_traffic(self, args):
        cluster = _need_cluster("measure")
        print(cluster.traffic())

    @verb("what a task printed, and its training progress; 'kernel' for the kernel's native log")
    @arg("task", nargs="?", default=None, help="worker:1, ps:0, or kernel")
    @arg("--tail", type=count, default=50, help="how many lines (0 for all)")
    @arg("--all", action="store_true", help="TensorFlow's own log lines too (left out by default)")
    def cmd_logs(self, args):
        if not args.task:
            raise UsageError("logs needs a task, for example: %tf_cluster logs worker:1 --tail 20")
        if args.task in ("kernel", "client"):
            from ..logs import read_tail

            path = owner.kernel_log()
            print(read_tail(str(path), args.tail or None) or f"(nothing logged yet in {path})")
            return
        cluster = _need_cluster("show logs of")
        print(cluster.logs(_task(cluster, args.task, "logs"), tail=args.tail or None, native=args.all))

    @verb("the ClusterSpec and each task's TF_CONFIG, as JSON")
    def cmd_spec(self, args):
        cluster = _need_cluster("describe")
        defn = cluster.cluster_def
        print("ClusterSpec:")
        print(json.dumps(defn.as_dict(), indent=2))
        for task in defn.tasks():
            print(f"TF_CONFIG for {task}:")
            print(json.dumps(defn.tf_config(task)))

    @verb("memory allowed for warm spare processes: a size such as 2GB, off, or auto")
    @arg("budget", nargs="?", default=None, help="2GB, 800MB, off, auto")
    def cmd_spares(self, args):
        pool = default_pool()
        if args.budget:
            try:
                parse_bytes(args.budget)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            pool.set_budget(args.budget)
        spares = pool.processes()
        pss = sum((memory_of(p.pid) or {}).get("pss", 0) for p in spares)
        print(
            f"Spare budget {human_bytes(pool.budget)}; {len(spares)} warm spare process"
            f"{'es' if len(spares) != 1 else ''} ({human_bytes(pss)} PSS)."
        )

    # -- failures on purpose ---------------------------------------------------
    @verb("a straggler: the task runs at 1/FACTOR speed (--factor 1 restores)")
    @arg("task", nargs="?", default=None, help="worker:1")
    @arg("--factor", type=number, default=4.0, help="1/FACTOR of full speed (>= 1)")
    def cmd_slow(self, args):
        cluster = _need_cluster("slow")
        task = _task(cluster, args.task, "slow")
        try:
            cluster.slow(task, args.factor)
        except ValueError as exc:
            raise UsageError(f"--{exc}") from None
        if args.factor > 1:
            print(
                f"{task} now runs at 1/{args.factor:g} speed; %tf_cluster slow {task} --factor 1 restores it."
            )
        else:
            print(f"{task} runs at full speed again.")

    @verb(
        "the modelled network, live: a relayed task's card (ps:0) or a link into it (worker:0->ps:0): "
        "--rate 100mbit --delay 2ms; with no target, every card and link (relays chosen at start with --net)"
    )
    @arg(
        "target",
        nargs="?",
        default=None,
        help="ps:0 (its card), worker:0->ps:0 or 'worker:0 -> ps:0' (a link)",
    )
    @arg("--rate", default=None, help="each way, as tc writes it: 100mbit, 1gbit, 5mbps (megabytes/s); none")
    @arg("--delay", default=None, help="one way: 2ms (default 0)")
    def cmd_net(self, args):
        cluster = _need_cluster("shape")
        if args.target is None:
            if args.rate is not None or args.delay is not None:
                raise UsageError(
                    "net needs a card or link to change, e.g. %tf_cluster net worker:0->ps:0 --rate 10mbit"
                )
            try:
                print(cluster.net())
            except TfmagicError as exc:
                raise UsageError(render.as_magic(str(exc))) from None
            return
        target = unquote(args.target)
        try:
            model = cluster.net(target, rate=args.rate, delay=args.delay)
        except TfmagicError as exc:
            raise UsageError(render.as_magic(str(exc))) from None
        if "->" not in target:
            print(f"{cluster.check_task(target)}'s network card now: {model.describe()}.")
        elif model.lifted:
            print(f"{target}: no link rule now; its bytes cross the card only.")
        else:
            print(f"{target} now: {model.describe()} (on top of the card).")

    @verb("kill a task's process, as a crash would")
    @arg("task", nargs="?", default=None, help="worker:1")
    def cmd_kill(self, args):
        cluster = _need_cluster("kill")
        task = _task(cluster, args.task, "kill")
        pid = cluster.procs[task].pid
        cluster.kill(task)
        print(f"Killed {task} (pid {pid}). %tf_cluster restart {task} brings it back.")

    @verb("start a task again on its old address (--force replaces one that still runs, losing its state)")
    @arg("task", nargs="?", default=None, help="worker:1, or relay (the modelled network's relay)")
    @arg("--force", action="store_true", help="replace a task that is still running")
    def cmd_restart(self, args):
        cluster = _need_cluster("restart")
        if args.task == "relay":  # the modelled network's relay process, not a task
            try:
                pid = cluster.restart_relay()
            except TfmagicError as exc:
                raise UsageError(render.as_magic(str(exc))) from None
            print(
                f"Restarted the network relay (pid {pid}) on the same ports, with the same cards and links."
            )
            return
        task = _task(cluster, args.task, "restart")
        try:
            outcome = cluster.restart(task, force=args.force)
        except ClusterStartError as exc:
            if exc.log_tail:
                print(f"--- last lines of {exc.task}'s log ---\n{exc.log_tail}", file=sys.stderr)
            raise UsageError(render.as_magic(str(exc))) from None
        how = _restarted_how(cluster.procs[task], outcome)
        print(
            f"Restarted {task} on {cluster.address(task)} in {outcome.seconds:.2f} s ({how}, "
            f"pid {cluster.procs[task].pid})."
        )

    # -- membership -----------------------------------------------------------
    @verb("add tasks to the running cluster (a warm spare where one exists); nothing else restarts")
    @arg("job", nargs="?", default=None, help="worker or ps")
    @arg("--count", type=positive_count, default=1, help="how many (default 1)")
    def cmd_add(self, args):
        cluster = _need_cluster("add to")
        if not args.job:
            raise UsageError("add needs a job, for example: %tf_cluster add worker --count 1")
        try:
            outcome = cluster.add(unquote(args.job), count=args.count)
        except KeyboardInterrupt:
            print(
                f"Interrupted: the tasks being added were stopped; the cluster is as it was "
                f"({cluster.shape.describe()}).",
                file=sys.stderr,
            )
            return
        except ClusterStartError as exc:
            if exc.log_tail:
                print(f"--- last lines of {exc.task}'s log ---\n{exc.log_tail}", file=sys.stderr)
            raise UsageError(render.as_magic(str(exc))) from None
        except TfmagicError as exc:
            raise UsageError(render.as_magic(str(exc))) from None
        how = f"{outcome.warm} warm spare(s)" if outcome.warm else "new process(es)"
        print(
            f"{', '.join(outcome.tasks)} joined in {outcome.seconds:.2f} s ({how}); "
            f"the cluster has {cluster.shape.describe()}."
        )

    @verb(
        "remove the highest-numbered worker or ps (a ps: its variables moved off first); --drain lets a worker finish its step"
    )
    @arg("task", nargs="?", default=None, help="worker:2")
    @arg("--drain", action="store_true", help="finish its step under way (default: drop it unapplied)")
    def cmd_remove(self, args):
        cluster = _need_cluster("remove")
        task = _task(cluster, args.task, "remove")
        try:
            outcome = cluster.remove(task, drain=args.drain)
        except TfmagicError as exc:
            raise UsageError(render.as_magic(str(exc))) from None
        notes = "".join(f" {n}." for n in outcome.notes)
        print(f"{task} left in {outcome.seconds:.2f} s; the cluster has {cluster.shape.describe()}.{notes}")

    # -- elsewhere -------------------------------------------------------------
    @verb("write a Slurm script or Kubernetes manifests for this cluster's shape")
    @arg("kind", nargs="?", default=None, help="slurm, k8s or tfjob")
    @arg("--out", default=None, help="write to this file instead of printing")
    @arg("--force", action="store_true", help="overwrite --out if it exists")
    @arg("--image", default=None, help="k8s/tfjob: the container image with TensorFlow and your program")
    @arg("--ps", type=count, default=None, help="ps tasks (default: the running cluster's, else 1)")
    @arg("--workers", type=count, default=None, help="workers (default: the running cluster's, else 2)")
    def cmd_export(self, args):
        from ..export import export, write_export

        given = (args.kind or "").lower()
        kind = {"k8s": "kubernetes", "kube": "kubernetes"}.get(given, given)
        if kind not in ("slurm", "kubernetes", "tfjob"):
            raise UsageError("export needs what to write: %tf_cluster export slurm|k8s|tfjob [--out FILE]")
        options = {}
        if kind != "slurm":
            if not args.image:
                raise UsageError(
                    f"export {args.kind} needs --image, the container image holding TensorFlow and your program"
                )
            options["image"] = args.image
        if args.force and not args.out:
            raise UsageError("--force is for --out FILE: it overwrites that file")
        running = session.default().running()
        if args.ps is not None or args.workers is not None or running is None:
            shape = ClusterShape(
                ps=1 if args.ps is None else args.ps, workers=2 if args.workers is None else args.workers
            )
        else:
            shape = running.shape
        if args.out:
            try:
                path = write_export(kind, args.out, shape, force=args.force, **options)
            except TfmagicError as exc:
                raise UsageError(str(exc).replace("force=True", "--force")) from None
            print(f"Wrote {path} ({kind}, {shape.describe()}); see docs/export.md for how to run it.")
        else:
            print(export(kind, shape, **options))


VERBS = Verbs("tf_cluster", ClusterMagics, default="status")
ClusterMagics.tf_cluster.__doc__ = (ClusterMagics.tf_cluster.__doc__ or "") + "\n" + VERBS.usage()


def _restarted_how(proc, outcome) -> str:
    """What a restart started: a warm spare, a new process, or a new server in a shared one."""
    if getattr(proc, "shared_with", None):
        return "a new server in the process it shares"
    return "a warm spare" if outcome.warm else "a new process"


def _jitter(given: str | None) -> float | None:
    """``--jitter 0.1`` as a number, or one line saying what to give."""
    if given is None:
        return None
    try:
        value = float(given)
    except ValueError:
        raise UsageError(f"--jitter is a number such as 0.1 (about +-10 %), not {given!r}") from None
    if not 0 <= value < 2:
        raise UsageError(f"--jitter is 0 to 2 (a log spread; 0.1 is about +-10 %), not {value:g}")
    return value


def _measure_pace(cluster) -> None:
    """``--pace auto``: measure the machine now, so the student sees the pace before training."""
    pace = cluster.pace
    if pace is None or pace.calibrated:
        return
    from ..training.run import measure_pace

    print("pace auto: measuring this machine (a short unpaced run, a few seconds) ...", flush=True)
    try:
        measure_pace(cluster)
    except TfmagicError as exc:
        raise UsageError(render.as_magic(str(exc))) from None
    print(f"pace: {pace.measured}")
