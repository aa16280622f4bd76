"""A task's start-up, in its order: tie to the owner, guard the bind, keeper, then serve (one task, or several)."""

from __future__ import annotations

import os
import signal
import threading

from . import lifeline


def main() -> None:
    lifeline.tie_to_owner()
    lifeline.guard_self()  # may re-execute this program with the bind guard preloaded
    if os.environ.get("TFMAGIC_PDEATHSIG") == "1":
        lifeline.start_keeper()
    lifeline.keep_guard_dir(os.environ.pop("TFMAGIC_GUARD_TMPDIR", None))
    for key in ("TFMAGIC_PDEATHSIG", "TFMAGIC_OWNER_PID"):
        os.environ.pop(key, None)  # meant for this process, not for what its cells start
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .server import quiet_queue_runner_shutdown

    threading.excepthook = quiet_queue_runner_shutdown
    shared = os.environ.pop("TFMAGIC_CHANNELS", None)
    if shared:  # several tasks in this process, a channel each (processes=)
        from . import host

        host.run(shared)
    else:
        from .runtime import TaskRuntime

        TaskRuntime().run()


__all__ = ["main"]
