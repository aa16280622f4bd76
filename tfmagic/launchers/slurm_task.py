"""The Slurm side of the Slurm launcher: each task of a tfmagic job runs this relay.

    srun ... python -m tfmagic.launchers.slurm_task CONFIG

``CONFIG`` is a file only its owner can read (the launcher writes it beside the cluster's logs:
the address to dial back to, the cluster's secret, the Python and environment of the task).  The
relay's slot is Slurm's task rank (``SLURM_PROCID``), its attempt Slurm's restart count; from
there it is :func:`tfmagic.launchers.spark_task.relay`: connect back, prove the secret, start the
task process as a child and carry its channel and log until the task ends.  When the kernel goes
away (``stop``, its death, even ``kill -9``) the connection ends, the task ends, this relay exits
and with the last of them the job step and the job.  Standard library only, like the Spark relay.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

from . import spark_task


def keeper(stream=None) -> int:
    """``--keeper``: cancel every job id read from standard input once it ends.

    The launcher starts one beside the kernel (in a session of its own, so that ending the kernel's
    process group spares it) and writes each job id it submits.  When the kernel ends, however it
    ends, the pipe does too, and the jobs are cancelled: a job still *pending* has no relay inside
    it to notice that its kernel is gone.  On a normal stop the launcher cancelled them already, and
    cancelling an ended job is harmless.
    """
    ids = []
    for line in stream or sys.stdin:
        line = line.strip()
        if line.isdigit() or line.replace("_", "").isdigit():
            ids.append(line)
    scancel = shutil.which("scancel")
    if ids and scancel:
        subprocess.run([scancel, *ids], stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--keeper"]:
        return keeper()
    if len(args) != 1:
        print("usage: python -m tfmagic.launchers.slurm_task CONFIG | --keeper", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        config = json.load(f)
    slot = int(os.environ.get("SLURM_PROCID", "0"))
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    try:
        spark_task.relay(config, slot, attempt)
    except Exception as exc:  # noqa: BLE001 - one line in the job's output, a failed step
        where = socket.gethostname()
        print(f"tfmagic relay for slot {slot} on {where}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    # The task's own exit code went to the kernel on the log connection; a task ended on purpose
    # (kill worker:1) must not fail the step, whose other tasks serve on.
    return 0


if __name__ == "__main__":
    sys.exit(main())
