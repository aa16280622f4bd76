"""Start one TensorFlow task of a cluster exported by tfmagic, then serve or run the program.

Every task of an exported cluster runs this same file: a Slurm script carries
its text and passes it to ``python -c``, a Kubernetes ConfigMap mounts it as
launch.py.  It runs on machines where tfmagic is not installed, so it needs
only the standard library and TensorFlow, and imports nothing from tfmagic.
It finds out which task it is (from Slurm's step variables through
SlurmClusterResolver, or from TF_CONFIG), sets TF_CONFIG and then plays its
job's role:

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
                jobs=jobs,
                port_base=port_base,
                gpus_per_node=gpus_per_node,
                gpus_per_task=gpus_per_task,
                auto_set_gpu=True,
            )
        else:
            # CPU only.  The resolver lists at most gpus_per_node // gpus_per_task
            # tasks per node (and cannot divide by zero), so it is told of one
            # "GPU" per task and asked to leave CUDA_VISIBLE_DEVICES alone.
            resolver = resolver_class(
                jobs=jobs,
                port_base=port_base,
                gpus_per_node=sum(jobs.values()),
                gpus_per_task=1,
                auto_set_gpu=False,
            )
        cluster = resolver.cluster_spec().as_dict()
    except RuntimeError as exc:
        raise SystemExit(
            "tfmagic launcher: SlurmClusterResolver failed: %s. This script was exported for "
            "jobs %s; submit it with the Slurm options it was written with, or export it again "
            "for the new shape." % (exc, jobs)
        )
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
            % (job, index, cluster[job][index], os.environ.get("SLURM_PROCID"), node, local)
        )


def resolve_tf_config():
    """(cluster, job, index) of this process from TF_CONFIG."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec().as_dict()
    if not cluster or resolver.task_type is None or resolver.task_id is None:
        raise SystemExit(
            "tfmagic launcher: TF_CONFIG is missing or names no task (TF_CONFIG=%r); "
            'set it to {"cluster": {...}, "task": {"type": ..., "index": ...}}' % os.environ.get("TF_CONFIG")
        )
    return cluster, resolver.task_type, int(resolver.task_id)


def configure(cluster, job, index, gpus_per_task=0):
    """Set TF_CONFIG, and hide GPUs from ps tasks (and from all tasks when none were asked for)."""
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
    if job == "ps" or not gpus_per_task:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def program_addresses(cluster, roles):
    """Addresses of the tasks that run the program: what serving tasks wait for."""
    return [a for job, addrs in sorted(cluster.items()) if "run" in roles.get(job, "") for a in addrs]


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
    except BaseException:  # noqa: BLE001 - the program's own error, shown, becomes the exit code
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
    program = argv[cut + 1 :]
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
        tf.train.ClusterSpec(cluster), job_name=job, task_index=index, protocol="grpc", start=True
    )
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
