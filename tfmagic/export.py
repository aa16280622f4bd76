"""Export a cluster description to engines tfmagic cannot run here: Slurm and Kubernetes.

A local cluster is for learning and trying; the same ps/worker layout then has
to run where the machines are.  This module turns a cluster description (a
:class:`~tfmagic.spec.ClusterShape`, a :class:`~tfmagic.spec.ClusterDef` or a
``{job: count}`` mapping) into files those engines take as they are:

* :func:`slurm_script`: a batch script for ``sbatch`` with one ``srun`` step
  whose Slurm tasks become the TensorFlow tasks, through TensorFlow's own
  ``SlurmClusterResolver``;
* :func:`kubernetes_manifests`: a headless Service and a Pod per task, each Pod
  with its ``TF_CONFIG``; or, with ``tfjob=True``, one Kubeflow ``TFJob``.

Both run one small launcher (:data:`LAUNCHER`, plain Python that needs only
TensorFlow) in every task: it finds out which task it is, sets ``TF_CONFIG``,
starts the task's ``tf.distribute.Server`` where the strategy wants one, keeps
ps tasks serving until every task running the program has finished, and runs
your program in the others.  The program therefore reads ``TF_CONFIG`` the
same way on Slurm, on Kubernetes and in a tfmagic task.

>>> from tfmagic.spec import ClusterShape
>>> script = slurm_script(ClusterShape(ps=1, workers=2), program="train.py")
>>> "#SBATCH --ntasks=3" in script
True

Nothing here imports TensorFlow or talks to Slurm or Kubernetes.  The output is
checked by tests (parsed, ``bash -n``, read back by TensorFlow's resolvers in a
simulated allocation), but it has not been run on a real Slurm or Kubernetes
cluster; ``docs/export.md`` says what was checked and how.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import ExportError, TfmagicError
from .spec import ClusterDef, ClusterShape

#: How the program uses the cluster, which decides what each task's launcher does.
#:
#: ``between-graph``: ps tasks serve; every worker (and chief) starts its server
#: and runs the program in the same process (TF1 replication, as in tfmagic's
#: own training).  ``parameter-server``: TF2 ``ParameterServerStrategy``; ps and
#: workers serve, the chief (required) runs the program as coordinator.
#: ``collective``: ``MultiWorkerMirroredStrategy``, no ps; every task runs the
#: program, whose strategy starts the server.  ``custom``: every task, ps
#: included, runs the program, which starts its own server from ``TF_CONFIG``.
STRATEGIES = ("between-graph", "parameter-server", "collective", "custom")

#: What :func:`write_export` and the command line can write.
KINDS = ("slurm", "kubernetes", "tfjob")

_JOBS = ("chief", "ps", "worker")
_TFJOB_REPLICA = {"chief": "Chief", "ps": "PS", "worker": "Worker"}
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SLURM_TIME = re.compile(r"^(\d+|\d+:\d\d|\d+:\d\d:\d\d|\d+-\d+|\d+-\d+:\d\d|\d+-\d+:\d\d:\d\d)$")
_SLURM_WORD = re.compile(r"^[A-Za-z0-9_.+,-]+$")
_IMAGE = re.compile(r"^[^\s'\"]+$")

#: Where the Kubernetes Pods mount the launcher (from a ConfigMap).
LAUNCHER_DIR = "/etc/tfmagic"

LAUNCHER = r'''"""Start one TensorFlow task of a cluster exported by tfmagic, then serve or run the program.

Written by tfmagic.export into Slurm scripts and Kubernetes manifests; it
needs only TensorFlow.  Every task runs this same file, which finds out which
task it is (from Slurm's step variables through SlurmClusterResolver, or from
TF_CONFIG), sets TF_CONFIG and then plays its job's role:

  serve       start a tf.distribute.Server and keep it up (ps tasks); exit
              once every task that runs the program has finished
  serve+run   start a server in this process, then run the program in it
              (between-graph replication; the program finds the server as the
              global `server`, or at its own address in TF_CONFIG)
  run         only run the program; its strategy starts the server itself

ps tasks always get CUDA_VISIBLE_DEVICES="", and so does every task when no
GPUs were asked for.  With TFMAGIC_DRY_RUN=1 in the environment each task
prints where it was placed and its TF_CONFIG, then exits without starting
anything: a cheap check of an allocation.

usage: launch.py --resolver slurm|tf_config [--jobs ps=1,worker=2]
                 [--port-base 8888] [--gpus-per-task 0] [--gpus-per-node 0]
                 --role JOB=ROLE ... [--poll 2] [--keep-serving]
                 -- PROGRAM [ARGS ...]
"""
import argparse
import atexit
import json
import os
import runpy
import socket
import sys
import time
import traceback

ROLES = ("serve", "serve+run", "run")


def say(text):
    print("tfmagic launcher: " + text, flush=True)


def parse_counts(text):
    """'ps=1,worker=2' -> {'ps': 1, 'worker': 2}"""
    counts = {}
    for part in text.split(","):
        job, _, n = part.partition("=")
        counts[job.strip()] = int(n)
    return counts


def resolve_slurm(jobs, port_base, gpus_per_task=0, gpus_per_node=0):
    """(cluster, job, index) of this process from Slurm's step variables."""
    import tensorflow as tf

    resolver_class = tf.distribute.cluster_resolver.SlurmClusterResolver
    try:
        if gpus_per_task:
            resolver = resolver_class(
                jobs=jobs, port_base=port_base, gpus_per_node=gpus_per_node,
                gpus_per_task=gpus_per_task, auto_set_gpu=True)
        else:
            # CPU only.  The resolver lists at most gpus_per_node // gpus_per_task
            # tasks per node (and cannot divide by zero), so it is told of one
            # "GPU" per task and asked to leave CUDA_VISIBLE_DEVICES alone.
            resolver = resolver_class(
                jobs=jobs, port_base=port_base, gpus_per_node=sum(jobs.values()),
                gpus_per_task=1, auto_set_gpu=False)
        cluster = resolver.cluster_spec().as_dict()
    except RuntimeError as exc:
        raise SystemExit(
            "tfmagic launcher: SlurmClusterResolver failed: %s. This script was exported for "
            "jobs %s; submit it with the Slurm options it was written with, or export it again "
            "for the new shape." % (exc, jobs))
    job, index = resolver.task_type, resolver.task_id
    check_slurm_placement(cluster, job, index, port_base)
    return cluster, job, index


def check_slurm_placement(cluster, job, index, port_base):
    """Stop if the resolver's address for this rank is not where Slurm put it.

    SlurmClusterResolver orders nodes by name as text (node10 before node9);
    Slurm hands out ranks in its own node order.  When the two disagree every
    task would serve on one node while the others look for it on another.
    """
    node = os.environ.get("SLURMD_NODENAME")
    local = os.environ.get("SLURM_LOCALID")
    if node is None or local is None:
        return
    host, port = cluster[job][index].rsplit(":", 1)
    if host != node or int(port) - port_base != int(local):
        raise SystemExit(
            "tfmagic launcher: SlurmClusterResolver placed %s:%d at %s, but Slurm runs this rank "
            "(%s) on %s as local task %s. The resolver sorts node names as text while Slurm "
            "orders ranks its own way; ask for nodes whose names sort the same both ways "
            "(zero-padded, e.g. node[01-12]) with --nodelist, or for a single node."
            % (job, index, cluster[job][index], os.environ.get("SLURM_PROCID"), node, local))


def resolve_tf_config():
    """(cluster, job, index) of this process from TF_CONFIG."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec().as_dict()
    if not cluster or resolver.task_type is None or resolver.task_id is None:
        raise SystemExit(
            "tfmagic launcher: TF_CONFIG is missing or names no task (TF_CONFIG=%r); "
            "set it to {\"cluster\": {...}, \"task\": {\"type\": ..., \"index\": ...}}"
            % os.environ.get("TF_CONFIG"))
    return cluster, resolver.task_type, int(resolver.task_id)


def configure(cluster, job, index, gpus_per_task=0):
    """Set TF_CONFIG, and hide GPUs from ps tasks (and from all tasks when none were asked for)."""
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
    if job == "ps" or not gpus_per_task:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def program_addresses(cluster, roles):
    """Addresses of the tasks that run the program: what serving tasks wait for."""
    return [a for job, addrs in sorted(cluster.items()) if "run" in roles.get(job, "")
            for a in addrs]


def port_open(address, timeout=1.0):
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
        return True
    except OSError:  # refused, unreachable, or no DNS name (yet, or any more)
        return False


def wait_until_done(addresses, poll=2.0, probe=port_open, sleep=time.sleep):
    """Return once every address has been seen accepting connections and none does now."""
    seen = set()
    while True:
        up = {a for a in addresses if probe(a)}
        seen |= up
        if len(seen) == len(set(addresses)) and not up:
            return
        sleep(poll)


def run_program(argv, server):
    """Run the program as __main__ in this process; return its exit code."""
    sys.argv = list(argv)
    try:
        runpy.run_path(argv[0], run_name="__main__", init_globals={"server": server})
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def finish(code):
    """Leave without tearing down the gRPC server in Python's finalizers.

    The program's own exit handlers (summary writers, checkpoints) run first.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--" not in argv:
        raise SystemExit("tfmagic launcher: put the program after '--', e.g. -- train.py --epochs 3")
    cut = argv.index("--")
    program = argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="tfmagic-launch", description=__doc__.split("\n")[0])
    parser.add_argument("--resolver", choices=("slurm", "tf_config"), required=True)
    parser.add_argument("--jobs", type=parse_counts, help="job=count,...; the slurm resolver needs it")
    parser.add_argument("--port-base", type=int, default=8888)
    parser.add_argument("--gpus-per-task", type=int, default=0)
    parser.add_argument("--gpus-per-node", type=int, default=0)
    parser.add_argument("--role", action="append", default=[], metavar="JOB=ROLE")
    parser.add_argument("--poll", type=float, default=2.0, help="seconds between checks of the program tasks")
    parser.add_argument("--keep-serving", action="store_true", help="serving tasks never stop on their own")
    args = parser.parse_args(argv[:cut])
    roles = dict(r.split("=", 1) for r in args.role)
    for job, role in roles.items():
        if role not in ROLES:
            parser.error("role %r of job %s is not one of %s" % (role, job, ", ".join(ROLES)))
    if args.resolver == "slurm":
        if not args.jobs:
            parser.error("--resolver slurm needs --jobs, e.g. --jobs ps=1,worker=2")
        cluster, job, index = resolve_slurm(args.jobs, args.port_base, args.gpus_per_task, args.gpus_per_node)
    else:
        cluster, job, index = resolve_tf_config()
    role = roles.get(job)
    if role is None:
        raise SystemExit("tfmagic launcher: no --role for job %r (have %s)" % (job, roles))
    if "run" in role and not program:
        raise SystemExit("tfmagic launcher: %s:%d should run a program; none follows '--'" % (job, index))
    configure(cluster, job, index, args.gpus_per_task)
    say("%s:%d at %s, role %s" % (job, index, cluster[job][index], role))
    if os.environ.get("TFMAGIC_DRY_RUN"):
        say("TF_CONFIG=" + os.environ["TF_CONFIG"])
        say("CUDA_VISIBLE_DEVICES=%r" % os.environ.get("CUDA_VISIBLE_DEVICES"))
        return 0
    if role == "run":
        return run_program(program, None)

    import tensorflow as tf

    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster), job_name=job, task_index=index, protocol="grpc", start=True)
    if role == "serve":
        targets = program_addresses(cluster, roles)
        if args.keep_serving or not targets:
            server.join()
        wait_until_done(targets, args.poll)
        say("every task running the program has finished; %s:%d stops" % (job, index))
        finish(0)
    code = run_program(program, server)
    # Stay reachable a little longer, so that serving tasks see this one up at
    # least once even if the program was very short.
    time.sleep(2 * args.poll + 1)
    finish(code)


if __name__ == "__main__":
    sys.exit(main())
'''


# --------------------------------------------------------------------------
# the cluster description


def job_counts(cluster: ClusterShape | ClusterDef | Mapping[str, int]) -> dict[str, int]:
    """Tasks per job, in the order ``chief, ps, worker``, without empty jobs.

    The export needs only the shape: addresses in a ``ClusterDef`` belong to
    this machine and mean nothing on another engine.

    >>> job_counts({"worker": 2, "ps": 1})
    {'ps': 1, 'worker': 2}
    """
    if isinstance(cluster, ClusterShape):
        return cluster.counts()
    if isinstance(cluster, ClusterDef):
        counts = {job: len(addrs) for job, addrs in cluster.jobs.items()}
    elif isinstance(cluster, Mapping):
        counts = dict(cluster)
    else:
        raise ExportError(
            f"export needs a ClusterShape, a ClusterDef or a {{job: count}} mapping, not {cluster!r}; "
            "for example ClusterShape(ps=1, workers=2)"
        )
    unknown = sorted(set(counts) - set(_JOBS))
    if unknown:
        raise ExportError(
            f"cannot export job(s) {', '.join(map(repr, unknown))}: the export knows the jobs "
            "chief, ps and worker; rename or drop the others"
        )
    shape = ClusterShape(
        ps=counts.get("ps", 0), workers=counts.get("worker", 0), chief=counts.get("chief", 0)
    )
    return shape.counts()


def roles(counts: Mapping[str, int], strategy: str = "between-graph") -> dict[str, str]:
    """What the launcher does in each job's tasks: ``serve``, ``serve+run`` or ``run``.

    >>> roles({"ps": 1, "worker": 2})
    {'ps': 'serve', 'worker': 'serve+run'}
    """
    if strategy not in STRATEGIES:
        raise ExportError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if strategy == "parameter-server":
        if not counts.get("chief") or not counts.get("ps"):
            raise ExportError(
                "strategy 'parameter-server' (TF2 ParameterServerStrategy) needs a chief to coordinate "
                "and at least one ps; add chief=1 and ps=1 or more, or use strategy='between-graph'"
            )
        table = {"chief": "run", "ps": "serve", "worker": "serve"}
    elif strategy == "collective":
        if counts.get("ps"):
            raise ExportError(
                "strategy 'collective' (MultiWorkerMirroredStrategy) has no parameter servers; "
                "use ps=0, or strategy='between-graph' or 'parameter-server'"
            )
        table = {"chief": "run", "worker": "run"}
    elif strategy == "custom":
        table = dict.fromkeys(_JOBS, "run")
    else:
        table = {"chief": "serve+run", "ps": "serve", "worker": "serve+run"}
    return {job: table[job] for job in counts}


def _describe(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {job}" + ("s" if job == "worker" and n != 1 else "") for job, n in counts.items())


def _role_args(counts: Mapping[str, int], strategy: str) -> list[str]:
    out = []
    for job, role in roles(counts, strategy).items():
        out += ["--role", f"{job}={role}"]
    return out


def _check_port(port: int, span: int = 1) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or port < 1 or port + span - 1 > 65535:
        need = f"ports {port}..{port + span - 1}" if isinstance(port, int) and span > 1 else "a port"
        raise ExportError(
            f"port {port!r} does not fit: the tasks need {need} within 1..65535; "
            "pick a free port such as 2222 or 8888"
        )


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExportError(f"{name} must be a whole number, 0 or more, not {value!r}")


def _check_args(program_args: Sequence[str]) -> None:
    if isinstance(program_args, str) or not all(isinstance(a, str) for a in program_args):
        raise ExportError(
            f"program_args must be a list of strings, one per argument, not {program_args!r}; "
            "for example ['--epochs', '3']"
        )


def _one_line(name: str, value: str) -> str:
    if not isinstance(value, str) or not value.strip() or "\n" in value or "\r" in value:
        raise ExportError(f"{name} must be one line of text, not {value!r}")
    return value


# --------------------------------------------------------------------------
# Slurm


def slurm_script(
    cluster: ClusterShape | ClusterDef | Mapping[str, int],
    *,
    program: str = "train.py",
    program_args: Sequence[str] = (),
    python: str = "python3",
    port: int = 8888,
    partition: str | None = None,
    account: str | None = None,
    time: str | int = "01:00:00",
    gpus_per_worker: int = 0,
    tasks_per_node: int | None = None,
    job_name: str = "tfmagic",
    output: str = "%x-%j.out",
    setup: str | Sequence[str] = (),
    strategy: str = "between-graph",
) -> str:
    """A Slurm batch script that runs ``cluster`` as one ``srun`` step, one TensorFlow task per Slurm task.

    Every Slurm task runs the launcher, which builds TensorFlow's
    ``SlurmClusterResolver(jobs={...}, port_base=port)``: Slurm rank ``r``
    becomes the ``r``-th task with jobs in name order (chief, ps, worker), on
    port ``port + its local task number`` of its node.  ps tasks serve (with
    ``CUDA_VISIBLE_DEVICES=""``) until the program has finished everywhere;
    the others run ``program`` with ``TF_CONFIG`` set.

    ``setup`` lines run before the step (``module load ...``, ``source
    venv/bin/activate``); ``python`` is shell text, so ``$HOME/venv/bin/python``
    works.  With ``gpus_per_worker`` the resolver hands each task that many of
    its node's GPUs, which needs a fixed ``tasks_per_node``.

    >>> s = slurm_script({"ps": 1, "worker": 2}, program="train.py", partition="cpu")
    >>> [line for line in s.splitlines() if line.startswith("#SBATCH --ntasks")]
    ['#SBATCH --ntasks=3']
    """
    counts = job_counts(cluster)
    role_args = _role_args(counts, strategy)
    size = sum(counts.values())
    _check_count("gpus_per_worker", gpus_per_worker)
    if tasks_per_node is not None:
        _check_count("tasks_per_node", tasks_per_node)
        if tasks_per_node == 0:
            raise ExportError("tasks_per_node must be at least 1 (or None to let Slurm place the tasks)")
    if gpus_per_worker and tasks_per_node is None:
        raise ExportError(
            f"gpus_per_worker={gpus_per_worker} needs tasks_per_node: SlurmClusterResolver gives each task "
            "GPUs by its slot on a node, so each node must ask for tasks_per_node * gpus_per_worker GPUs; "
            "pass tasks_per_node=1 (--tasks-per-node 1) for one task per node"
        )
    per_node = min(tasks_per_node or size, size)
    _check_port(port, per_node)
    if isinstance(time, int) and not isinstance(time, bool):
        time = str(time)
    if not isinstance(time, str) or not _SLURM_TIME.match(time):
        raise ExportError(
            f"time {time!r} is not a Slurm time limit; write minutes ('90'), 'HH:MM:SS' ('01:30:00') "
            "or 'D-HH:MM:SS' ('1-00:00:00')"
        )
    for name, value in (("job_name", job_name), ("partition", partition), ("account", account)):
        if value is not None and (not isinstance(value, str) or not _SLURM_WORD.match(value)):
            raise ExportError(f"{name} {value!r} is not a Slurm name: use letters, digits and . _ + , - only")
    _one_line("program", program)
    _one_line("python", python)
    _one_line("output", output)
    _check_args(program_args)
    setup_lines = [setup] if isinstance(setup, str) else list(setup)
    setup_lines = [line for chunk in setup_lines for line in chunk.splitlines()]

    sbatch = [f"--job-name={job_name}", f"--ntasks={size}"]
    srun = ["srun", f"--ntasks={size}"]
    if tasks_per_node is not None:
        nodes = math.ceil(size / tasks_per_node)
        sbatch += [f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}"]
        srun += [f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}"]
    gpus_per_node = (tasks_per_node or 0) * gpus_per_worker
    if gpus_per_worker:
        sbatch.append(f"--gres=gpu:{gpus_per_node}")
        srun.append(f"--gres=gpu:{gpus_per_node}")
    sbatch += [f"--time={time}", f"--output={output}"]
    if partition:
        sbatch.append(f"--partition={partition}")
    if account:
        sbatch.append(f"--account={account}")
    srun += ["--distribution=block", "--kill-on-bad-exit=1"]

    jobs_arg = ",".join(f"{job}={n}" for job, n in sorted(counts.items()))
    launcher_args = ["--resolver", "slurm", "--jobs", jobs_arg, "--port-base", str(port)]
    if gpus_per_worker:
        launcher_args += ["--gpus-per-task", str(gpus_per_worker), "--gpus-per-node", str(gpus_per_node)]
    launcher_args += role_args
    command = " ".join(shlex.quote(a) for a in srun)
    command += f' \\\n    {python} -c "$TFMAGIC_LAUNCHER" \\\n    '
    command += " ".join(shlex.quote(a) for a in launcher_args)
    command += " \\\n    -- " + " ".join(shlex.quote(a) for a in [program, *program_args])

    ranks = []
    start = 0
    for job, n in sorted(counts.items()):
        span = f"{start}" if n == 1 else f"{start}-{start + n - 1}"
        ranks.append(f"rank {span}: {job}:0" if n == 1 else f"ranks {span}: {job}:0..{n - 1}")
        start += n
    what = _describe(counts)
    lines = [
        "#!/bin/bash",
        f"# Generated by tfmagic.export: {what}; strategy {strategy}.",
        "# Submit with:  sbatch <this file>     Check placement only:  TFMAGIC_DRY_RUN=1 sbatch <this file>",
        "#",
        f"# One srun step of {size} Slurm tasks; each becomes one TensorFlow task through",
        "# tf.distribute.cluster_resolver.SlurmClusterResolver (jobs in name order):",
        "#   " + "; ".join(ranks),
        f"# Each task listens on port {port} + its local task number on its node.",
        "# Checked by tfmagic's tests in a simulated allocation, not on a real Slurm cluster.",
        *[f"#SBATCH {opt}" for opt in sbatch],
        "",
        "set -euo pipefail",
        *setup_lines,
        "export PYTHONUNBUFFERED=1",
        "",
        "# The launcher (plain Python, needs only TensorFlow) is passed to every task with -c,",
        "# so nothing has to be copied to the nodes.",
        "IFS= read -r -d '' TFMAGIC_LAUNCHER <<'TFMAGIC_LAUNCHER_EOF' || true",
        LAUNCHER.rstrip("\n"),
        "TFMAGIC_LAUNCHER_EOF",
        "",
        command,
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Kubernetes


def _check_k8s_names(counts: Mapping[str, int], name: str, namespace: str | None) -> None:
    if not isinstance(name, str) or not _DNS1035.match(name):
        raise ExportError(
            f"name {name!r} cannot name Kubernetes objects: use lower-case letters, digits and '-', "
            "starting with a letter (for example 'mnist-ps')"
        )
    if namespace is not None and (
        not isinstance(namespace, str) or not _DNS1123.match(namespace) or len(namespace) > 63
    ):
        raise ExportError(
            f"namespace {namespace!r} is not a Kubernetes namespace name: lower-case letters, digits "
            "and '-', at most 63 characters"
        )
    longest = max((f"{name}-{job}-{n - 1}" for job, n in counts.items()), key=len)
    if len(longest) > 63:
        raise ExportError(
            f"the Service name {longest!r} would be {len(longest)} characters; Kubernetes allows 63. "
            "Use a shorter name"
        )


def task_dns_name(name: str, job: str, index: int) -> str:
    """The Service (and Pod) name of a task: ``<name>-<job>-<index>``, as the TFJob operator names them too."""
    return f"{name}-{job}-{index}"


def kubernetes_tf_configs(
    cluster: ClusterShape | ClusterDef | Mapping[str, int],
    *,
    name: str = "tfmagic",
    port: int = 2222,
    namespace: str | None = None,
    tfjob: bool = False,
) -> dict[str, dict]:
    """Each task's ``TF_CONFIG`` on Kubernetes, keyed by task (``"worker:1"``).

    For plain Pods this is what :func:`kubernetes_manifests` writes.  With
    ``tfjob=True`` it is what the Kubeflow training operator will set, as its
    source reads (``<name>-<job>-<i>.<namespace>.svc:<port>``, ``default``
    when no namespace is given); tfmagic cannot ask a real operator.

    >>> kubernetes_tf_configs({"ps": 1, "worker": 1})["worker:0"]["cluster"]
    {'ps': ['tfmagic-ps-0:2222'], 'worker': ['tfmagic-worker-0:2222']}
    """
    counts = job_counts(cluster)
    _check_k8s_names(counts, name, namespace)
    _check_port(port)
    # The operator always writes the namespace; our own Pods can rely on the
    # DNS search path when the manifests do not name one.
    suffix = f".{namespace or 'default'}.svc" if tfjob or namespace else ""
    spec = {
        job: [f"{task_dns_name(name, job, i)}{suffix}:{port}" for i in range(n)] for job, n in counts.items()
    }
    out = {}
    for job, n in counts.items():
        for i in range(n):
            config = {"cluster": spec, "task": {"type": job, "index": i}}
            if tfjob:
                config["environment"] = "cloud"
            out[f"{job}:{i}"] = config
    return out


def _container(
    *, image, python, program, program_args, role_args, port, port_name, job, gpus_per_worker, env
) -> dict:
    command = [python, f"{LAUNCHER_DIR}/launch.py", "--resolver", "tf_config"]
    if gpus_per_worker and job != "ps":
        command += ["--gpus-per-task", str(gpus_per_worker)]
    command += [*role_args, "--", program, *program_args]
    env = list(env) + [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if job == "ps" or not gpus_per_worker:
        env.append({"name": "CUDA_VISIBLE_DEVICES", "value": ""})
    container = {
        "name": "tensorflow",
        "image": image,
        "command": command,
        "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"}],
        "env": env,
        "volumeMounts": [{"name": "tfmagic-launcher", "mountPath": LAUNCHER_DIR, "readOnly": True}],
    }
    if gpus_per_worker and job != "ps":
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus_per_worker}}
    return container


def _metadata(name: str, namespace: str | None, labels: dict | None = None) -> dict:
    meta: dict = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = labels
    return meta


def kubernetes_manifests(
    cluster: ClusterShape | ClusterDef | Mapping[str, int],
    *,
    image: str,
    program: str = "train.py",
    program_args: Sequence[str] = (),
    python: str = "python3",
    port: int = 2222,
    name: str = "tfmagic",
    namespace: str | None = None,
    tfjob: bool = False,
    gpus_per_worker: int = 0,
    strategy: str = "between-graph",
) -> str:
    """Kubernetes manifests (multi-document YAML) that run ``cluster``: ``kubectl apply -f``.

    Each task gets a headless Service named ``<name>-<job>-<i>``, a stable DNS
    name for its address, and a bare Pod of the same name whose ``TF_CONFIG``
    lists those names.  Pods, not Deployments: a Deployment's replicas are
    interchangeable, but a TensorFlow task has a fixed identity (its
    ``TF_CONFIG``), and a ps restarted behind the workers' backs would have lost
    its variables; ``restartPolicy: Never`` makes a failure visible instead.
    A ConfigMap carries the launcher, mounted at ``/etc/tfmagic``.  ps Pods get
    ``CUDA_VISIBLE_DEVICES=""``; with ``gpus_per_worker`` the other Pods ask for
    ``nvidia.com/gpu``.

    With ``tfjob=True`` the output is one Kubeflow ``TFJob`` (``kubeflow.org/v1``)
    instead of Services and Pods: the training operator then creates both and
    sets ``TF_CONFIG`` itself, and it watches the pods and ends the job.

    ``image`` must hold TensorFlow and ``program`` (a path inside the image).

    >>> docs = kubernetes_manifests({"ps": 1, "worker": 2}, image="registry.example/train:1")
    >>> docs.count("kind: Pod"), docs.count("kind: Service")
    (3, 3)
    """
    counts = job_counts(cluster)
    role_args = _role_args(counts, strategy)
    _check_count("gpus_per_worker", gpus_per_worker)
    if not isinstance(image, str) or not _IMAGE.match(image):
        raise ExportError(
            f"image {image!r} is not a container image reference; pass the image that holds "
            "TensorFlow and your program, e.g. image='registry.example.com/me/train:1'"
        )
    _one_line("program", program)
    _one_line("python", python)
    _check_args(program_args)
    configs = kubernetes_tf_configs(counts, name=name, port=port, namespace=namespace, tfjob=tfjob)
    base_labels = {"app.kubernetes.io/name": "tfmagic", "app.kubernetes.io/instance": name}
    what = _describe(counts)
    header = [
        f"# Generated by tfmagic.export: {what}; strategy {strategy}.",
        "# Apply with:  kubectl apply -f <this file>"
        + ("" if namespace else "   (objects go to the current namespace)"),
        "# Checked by tfmagic's tests (parsed, TF_CONFIG read back by TFConfigClusterResolver),",
        "# not on a real Kubernetes cluster.",
    ]
    volume = {"name": "tfmagic-launcher", "configMap": {"name": f"{name}-launcher"}}
    docs: list[dict] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(f"{name}-launcher", namespace, base_labels),
            "data": {"launch.py": LAUNCHER},
        }
    ]
    common = {
        "image": image,
        "python": python,
        "program": program,
        "program_args": list(program_args),
        "role_args": role_args,
        "port": port,
        "gpus_per_worker": gpus_per_worker,
    }
    if tfjob:
        replicas = {}
        for job, n in counts.items():
            replicas[_TFJOB_REPLICA[job]] = {
                "replicas": n,
                "restartPolicy": "Never",
                "template": {
                    "metadata": {"labels": {**base_labels, "tfmagic/job": job}},
                    "spec": {
                        "containers": [_container(**common, port_name="tfjob-port", job=job, env=[])],
                        "volumes": [volume],
                    },
                },
            }
        spec: dict = {"runPolicy": {"cleanPodPolicy": "Running"}}
        if "chief" not in counts:
            # The default policy ends the job when worker 0 succeeds, which would
            # stop the other workers of between-graph training mid-run.
            spec["successPolicy"] = "AllWorkers"
        spec["tfReplicaSpecs"] = replicas
        docs.append(
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "TFJob",
                "metadata": _metadata(name, namespace, base_labels),
                "spec": spec,
            }
        )
    else:
        services, pods = [], []
        for job, n in counts.items():
            for i in range(n):
                dns = task_dns_name(name, job, i)
                labels = {**base_labels, "tfmagic/job": job, "tfmagic/task": f"{job}-{i}"}
                selector = {"app.kubernetes.io/instance": name, "tfmagic/task": f"{job}-{i}"}
                services.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Service",
                        "metadata": _metadata(dns, namespace, labels),
                        "spec": {
                            "clusterIP": "None",
                            # the tasks look each other up while starting, before any is "ready"
                            "publishNotReadyAddresses": True,
                            "selector": selector,
                            "ports": [{"name": "tf", "port": port, "targetPort": port, "protocol": "TCP"}],
                        },
                    }
                )
                env = [{"name": "TF_CONFIG", "value": json.dumps(configs[f"{job}:{i}"])}]
                pods.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": _metadata(dns, namespace, labels),
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [_container(**common, port_name="tf", job=job, env=env)],
                            "volumes": [volume],
                        },
                    }
                )
        docs += services + pods
    return "\n".join(header) + "\n" + "".join("---\n" + to_yaml(doc) for doc in docs)


# --------------------------------------------------------------------------
# YAML, without a YAML library (PyYAML is not a tfmagic dependency)

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "none", "~"}


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise TypeError(f"cannot write {value!r} as YAML")
    if _PLAIN.match(value) and value.lower() not in _YAML_WORDS:
        return value
    if value.isprintable():
        return "'" + value.replace("'", "''") + "'"
    return json.dumps(value)  # a JSON string is a valid YAML double-quoted scalar


def _literal_block_ok(text: str) -> bool:
    """Whether ``text`` reads back unchanged from a plain ``|`` block (else it is quoted)."""
    return (
        "\n" in text.rstrip("\n")
        and text.endswith("\n")
        and not text.endswith("\n\n")
        and not text[0].isspace()
        and all(line.isprintable() for line in text.split("\n"))
    )


def _yaml_lines(value: object, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            head = f"{pad}{_scalar(str(key))}:"
            if isinstance(item, str) and _literal_block_ok(item):
                lines.append(head + " |")
                lines += [f"{pad}  {line}" if line else "" for line in item.rstrip("\n").split("\n")]
            elif isinstance(item, (dict, list)) and item:
                lines.append(head)
                lines += _yaml_lines(item, indent + 2)
            elif isinstance(item, (dict, list)):
                lines.append(head + (" {}" if isinstance(item, dict) else " []"))
            else:
                lines.append(f"{head} {_scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)) and item:
                inner = _yaml_lines(item, indent + 2)
                lines.append(f"{pad}- {inner[0].lstrip()}")
                lines += inner[1:]
            else:
                lines.append(f"{pad}- {_scalar(item) if not isinstance(item, (dict, list)) else '[]'}")
    else:
        lines.append(pad + _scalar(value))
    return lines


def to_yaml(document: Mapping) -> str:
    """One YAML document for the plain data manifests are made of (dicts, lists, str, int, bool)."""
    return "\n".join(_yaml_lines(dict(document), 0)) + "\n"


# --------------------------------------------------------------------------
# files and the command line


def export(kind: str, cluster: ClusterShape | ClusterDef | Mapping[str, int], **options) -> str:
    """The text of one export: ``kind`` is ``slurm``, ``kubernetes`` or ``tfjob``."""
    if kind == "slurm":
        return slurm_script(cluster, **options)
    if kind in ("kubernetes", "tfjob"):
        tfjob = options.pop("tfjob", False) or kind == "tfjob"
        return kubernetes_manifests(cluster, **options, tfjob=tfjob)
    raise ExportError(f"cannot export {kind!r}; choose one of {', '.join(KINDS)}")


def write_export(
    kind: str, path: str | Path, cluster: ClusterShape | ClusterDef | Mapping[str, int], **options
) -> Path:
    """Write :func:`export` to ``path`` (replacing it) and return the path.

    >>> write_export("slurm", "job.sbatch", ClusterShape(ps=1, workers=2), partition="cpu")  # doctest: +SKIP
    PosixPath('job.sbatch')
    """
    text = export(kind, cluster, **options)
    path = Path(path)
    path.write_text(text)
    if kind == "slurm":
        path.chmod(path.stat().st_mode | 0o111)
    return path


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (and exit status 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m tfmagic.export",
        description="Write a Slurm batch script or Kubernetes manifests for a ps/worker cluster.",
        epilog="Arguments after '--' are passed to the program. See docs/export.md.",
    )
    sub = parser.add_subparsers(dest="kind", required=True, parser_class=_Parser)
    for kind, help_text in (
        ("slurm", "a batch script for sbatch (SlurmClusterResolver)"),
        ("kubernetes", "headless Services and Pods with TF_CONFIG (or a TFJob with --tfjob)"),
    ):
        p = sub.add_parser(kind, help=help_text, description=help_text)
        p.add_argument("--ps", type=int, default=1, help="parameter servers (default 1)")
        p.add_argument("--workers", type=int, default=2, help="workers (default 2)")
        p.add_argument("--chief", type=int, default=0, help="0 or 1 chief (default 0)")
        p.add_argument("--strategy", choices=STRATEGIES, default="between-graph")
        p.add_argument("--program", default="train.py", help="the program the workers run (default train.py)")
        p.add_argument("--python", default="python3")
        p.add_argument("--gpus-per-worker", type=int, default=0)
        p.add_argument("-o", "--output", help="write to this file instead of standard output")
        p.add_argument("program_args", nargs="*", metavar="ARG", help="arguments for the program, after --")
        if kind == "slurm":
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
        else:
            p.add_argument("--image", required=True, help="container image with TensorFlow and the program")
            p.add_argument("--port", type=int, default=2222, help="port of every task (default 2222)")
            p.add_argument("--name", default="tfmagic", help="prefix of every object name (default tfmagic)")
            p.add_argument("--namespace")
            p.add_argument(
                "--tfjob", action="store_true", help="one Kubeflow TFJob instead of Services and Pods"
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tfmagic.export slurm --ps 1 --workers 2 > job.sbatch``"""
    parser = _parser()
    args = parser.parse_args(argv)
    options = {
        "program": args.program,
        "program_args": args.program_args,
        "python": args.python,
        "port": args.port,
        "gpus_per_worker": args.gpus_per_worker,
        "strategy": args.strategy,
    }
    if args.kind == "slurm":
        options.update(
            partition=args.partition,
            account=args.account,
            time=args.time,
            tasks_per_node=args.tasks_per_node,
            job_name=args.job_name,
            setup=args.setup,
        )
        kind = "slurm"
    else:
        options.update(image=args.image, name=args.name, namespace=args.namespace)
        kind = "tfjob" if args.tfjob else "kubernetes"
    try:
        shape = ClusterShape(ps=args.ps, workers=args.workers, chief=args.chief)
        if args.output:
            write_export(kind, args.output, shape, **options)
        else:
            sys.stdout.write(export(kind, shape, **options))
    except (TfmagicError, OSError) as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
