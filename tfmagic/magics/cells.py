"""``%%tf_device`` and ``%%tf_px``: cells that run on the cluster's tasks."""

from __future__ import annotations

import threading
import time

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .. import client, session
from ..errors import ShownAbove, TfmagicError
from ..spec import TaskName
from . import render
from .verbs import identifier, unquote, without_comment


@magics_class
class CellMagics(Magics):
    """In-graph (``%%tf_device``: the kernel is the client) and between-graph (``%%tf_px``) cells."""

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
        type=identifier,
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
        task.  Interrupting the kernel interrupts the tasks' cells.  A cell
        cannot read input (``input()``, ``breakpoint()``): a task has no keyboard.
        """
        args = parse_argstring(self.tf_px, without_comment(line))
        cluster = session.default().running()
        if cluster is None:
            raise UsageError(
                "no cluster is running, so there is nothing to run a cell in; start one with %tf_cluster start"
            )
        from ..px import run_px

        try:
            run = run_px(cluster, cell, unquote(args.targets))
        except TfmagicError as exc:
            raise UsageError(render.as_magic(str(exc))) from None
        if args.noblock:
            if args.output:
                self.shell.user_ns[args.output] = run.live_results
                print(
                    f"{args.output} fills in as each task finishes the cell ({args.output}[task]; run.wait() waits)."
                )
            return run
        failed = run.follow(say=render.as_magic)
        if args.output:
            self.shell.user_ns[args.output] = run.results
        if failed:
            raise ShownAbove(f"(%%tf_px: {', '.join(failed)}; the other tasks' output is above)")
        return None

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
        spec = unquote(without_comment(line))
        if not spec:
            raise UsageError("%%tf_device needs a task, for example: %%tf_device worker:1")
        cluster = session.default().running()
        if cluster is None:
            raise UsageError(
                f"no cluster is running, so there is no {spec} to run on; start one with %tf_cluster start"
            )
        try:
            task = cluster.check_task(spec)
        except TfmagicError as exc:
            raise UsageError(render.as_magic(str(exc))) from None
        return self._run_on(cluster, task, cell)

    def _run_on(self, cluster, task: TaskName, cell: str):
        box: dict = {}
        who = f"a %%tf_device {task} cell"

        def body() -> None:
            try:
                with cluster.device(task), client.gate.call(who, [task], "its ops"):
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
            raise ShownAbove(
                f"Interrupted: the cell waited {waited:.1f} s on {task} and was left running in the "
                f"background. Ops on {task} queue behind it until it ends; "
                f"%tf_cluster stop (or %tf_cluster restart {task} --force) ends it. The kernel is free."
            ) from None
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, TfmagicError):
                raise UsageError(render.as_magic(str(exc))) from None
            raise exc
        result = box.get("result")
        if result is not None and not result.success:
            raise ShownAbove(f"(the cell failed on {task}; its error is shown above)")
        return None
