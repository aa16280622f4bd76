"""TensorBoard event files for a training run: one writer per directory.

``<logdir>/<run>/<task>`` gets each worker's loss and step time;
``<logdir>/<run>/global`` the loss of every update.  So ``%tensorboard
--logdir <logdir>`` shows sync and async runs, per worker, side by side.
Written from a background thread fed by the run's :class:`History`, so the
workers' threads never wait on disk.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from ..metrics import GlobalStep, StepRecord


class SummaryWriterThread:
    def __init__(self, root: Path, history) -> None:
        self.root = Path(root)
        self._queue: queue.Queue = queue.Queue()
        self._writers: dict[str, object] = {}
        self._subscription = history.feed.subscribe(self._on_record)
        self._thread = threading.Thread(target=self._run, name="tfmagic-tensorboard", daemon=True)
        self._thread.start()

    def _on_record(self, item) -> None:
        if isinstance(item, StepRecord):
            self._queue.put(("step", item))
        elif isinstance(item, GlobalStep):
            self._queue.put(("global", item))

    def _writer(self, name: str):
        import tensorflow as tf

        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(str(self.root / name.replace(":", "-")))
        return self._writers[name]

    def _run(self) -> None:
        import tensorflow as tf

        with tf.device("/job:localhost/replica:0/task:0/device:CPU:0"):
            while True:
                item = self._queue.get()
                if item is None:
                    break
                kind, rec = item
                if kind == "step":
                    with self._writer(rec.task).as_default(step=rec.local_step):
                        tf.summary.scalar("loss", rec.loss)
                        tf.summary.scalar("step_time_s", rec.duration)
                        if rec.mode == "async":
                            tf.summary.scalar("staleness", rec.staleness)
                        else:
                            tf.summary.scalar("dropped", float(rec.dropped))
                else:
                    with self._writer("global").as_default(step=rec.step):
                        tf.summary.scalar("loss", rec.loss)
            for w in self._writers.values():
                w.close()  # flushes; a resumed run opens new event files beside these

    def close(self) -> None:
        self._subscription.close()
        self._queue.put(None)
        self._thread.join(30)
