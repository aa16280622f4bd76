"""Slurm batch scripts: one ``srun`` step whose Slurm tasks become the TensorFlow tasks.

Slurm already knows where every task runs, and TensorFlow already has a
resolver that reads it (``SlurmClusterResolver``), so the script asks Slurm for
one task per TensorFlow task and lets the launcher in each one resolve its
place.  The launcher's text travels inside the script and is passed to
``python -c``: nothing has to be copied to the nodes, which may not share a
file system with the machine the script was written on.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence

from ..errors import ExportError
from .checks import check_args, check_count, check_port, one_line
from .shape import ClusterLike, describe, job_counts, role_args
from .source import launcher_source

_SLURM_TIME = re.compile(r"^(\d+|\d+:\d\d|\d+:\d\d:\d\d|\d+-\d+|\d+-\d+:\d\d|\d+-\d+:\d\d:\d\d)$")
_SLURM_WORD = re.compile(r"^[A-Za-z0-9_.+,-]+$")

#: The here-document delimiter around the launcher's text in the script (no line of launch.py may be this).
HEREDOC_END = "TFMAGIC_LAUNCHER_EOF"


def slurm_script(
    cluster: ClusterLike,
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
    roles = role_args(counts, strategy)
    size = sum(counts.values())
    check_count("gpus_per_worker", gpus_per_worker)
    if tasks_per_node is not None:
        check_count("tasks_per_node", tasks_per_node)
        if tasks_per_node == 0:
            raise ExportError("tasks_per_node must be at least 1 (or None to let Slurm place the tasks)")
    if gpus_per_worker and tasks_per_node is None:
        raise ExportError(
            f"gpus_per_worker={gpus_per_worker} needs tasks_per_node: SlurmClusterResolver gives each task "
            "GPUs by its slot on a node, so each node must ask for tasks_per_node * gpus_per_worker GPUs; "
            "pass tasks_per_node=1 (--tasks-per-node 1) for one task per node"
        )
    per_node = min(tasks_per_node or size, size)
    check_port(port, per_node)
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
    one_line("program", program)
    one_line("python", python)
    one_line("output", output)
    check_args(program_args)
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
    launcher_args += roles
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
    lines = [
        "#!/bin/bash",
        f"# Generated by tfmagic.export: {describe(counts)}; strategy {strategy}.",
        "# Submit with:  sbatch <this file>     Check placement only:  TFMAGIC_DRY_RUN=1 sbatch <this file>",
        "#",
        f"# One srun step of {size} Slurm tasks; each becomes one TensorFlow task through",
        "# tf.distribute.cluster_resolver.SlurmClusterResolver (jobs in name order):",
        "#   " + "; ".join(ranks),
        f"# Each task listens on port {port} + its local task number on its node.",
        "# Run by tfmagic's tests on a real one-node Slurm and in a simulated two-node allocation.",
        *[f"#SBATCH {opt}" for opt in sbatch],
        "",
        "set -euo pipefail",
        *setup_lines,
        "export PYTHONUNBUFFERED=1",
        "",
        "# The launcher (tfmagic/export/launch.py: plain Python, needs only TensorFlow) is passed",
        "# to every task with -c, so nothing has to be copied to the nodes.",
        f"IFS= read -r -d '' TFMAGIC_LAUNCHER <<'{HEREDOC_END}' || true",
        launcher_source().rstrip("\n"),
        HEREDOC_END,
        "",
        command,
        "",
    ]
    return "\n".join(lines)
