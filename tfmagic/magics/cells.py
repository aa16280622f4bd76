"""``%%tf_device`` and ``%%tf_px``: cells that run on the cluster's tasks."""

from __future__ import annotations

import signal
import sys
import threading
import time

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .. import client, doctor, session
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
        failed = self._follow_px(run)
        if args.output:
            self.shell.user_ns[args.output] = run.results
        if failed:
            raise ShownAbove(f"(%%tf_px: {', '.join(failed)}; the other tasks' output is above)")
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
            elif outcome.status == "stopped":
                failed.append(f"{task} stopped with its cluster")
            elif outcome.status == "running":
                failed.append(f"{task} still running")
        return failed

    @staticmethod
    def _follow_px_events(run, sigint: list) -> None:
        import queue as _queue

        interrupted_at = None
        checked, stopped_since = time.monotonic(), None
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
                if time.monotonic() - checked > 1.0:  # a task stopped from outside mid-cell
                    checked = time.monotonic()
                    stuck = [
                        t
                        for t, o in run.outcomes.items()
                        if not o.done and run.cluster.condition(t).startswith("stopped")
                    ]
                    stopped_since = (stopped_since or checked) if stuck else None
                    if stuck and checked - stopped_since > 3:
                        print(
                            f"{', '.join(stuck)} is stopped (SIGSTOP): its cell goes on when it is continued; "
                            "not waiting for it here.",
                            file=sys.stderr,
                        )
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
            elif kind == "interrupted":  # where it was, not the whole traceback
                where = [ln.strip() for ln in payload.traceback if ln.strip().startswith("File ")]
                at = where[-1].split(", in ")[0].replace("File ", "") if where else ""
                print(f"[{task}] interrupted" + (f" at {at}" if at else ""), file=sys.stderr)
            elif kind == "error":
                print(
                    "".join(f"[{task}] {ln}" for ln in "".join(payload.traceback).splitlines(True)),
                    file=sys.stderr,
                    end="",
                )
                said = doctor.translate("".join(payload.traceback))
                if said:
                    print(f"[{task}] in words: {said}", file=sys.stderr)
            elif kind == "died":
                detail = payload.evalue if hasattr(payload, "evalue") else payload
                print(f"[{task}] {detail}; see %tf_cluster logs {task}", file=sys.stderr)
            elif kind == "stopped":
                print(f"[{task}] {payload.evalue}", file=sys.stderr)

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
