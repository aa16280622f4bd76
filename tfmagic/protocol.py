"""The control channel between an owner (kernel or script) and a task process.

One JSON object per line, in both directions.  The owner writes *ops* to the
task's standard input; the task answers with *events* on a private copy of
its original standard output (its own prints go to its log).  Plain JSON over
a byte stream works the same over a local pipe, an SSH channel or a Spark
executor's pipe, and it can be read in a log when something goes wrong.

Every message is named once, here: :class:`Op` (``{"op": ...}``, owner to
task) and :class:`Event` (``{"event": ...}``, task to owner), used by name on
both sides.  They are ``str`` enums, so they compare equal to the text on the
wire and go into JSON as it (never format one with an f-string: that gives
``Op.STATS``; use ``.value``).

The channel is also the task's lifeline: when the owner goes away (even by
``kill -9``) the task reads end-of-file and ends itself and its process group.
"""

from __future__ import annotations

import enum
import json
from typing import Any, BinaryIO


class Op(str, enum.Enum):
    """What an owner asks of a task."""

    #: take a role: a job, an index, the whole cluster's addresses (answered by READY or ASSIGN_FAILED)
    ASSIGN = "assign"
    #: the environment variables asked for, and the devices TensorFlow sees (ENV)
    ENV = "env"
    #: run a %%tf_px cell (STREAM lines, EXEC_READY at a barrier, then EXEC_DONE)
    EXEC = "exec"
    #: the variables %%tf_px cells left in the task (VARIABLES)
    VARIABLES = "variables"
    PING = "ping"
    #: end the task and everything it started
    STOP = "stop"
    # -- urgent: handled on the task's reader thread, even while a cell runs -------------
    #: run at 1/factor speed (SLOWED)
    SLOW = "slow"
    #: a line for the task's log (no answer)
    NOTE = "note"
    #: a free port on the task's host (FREE_PORT)
    FREE_PORT = "free_port"
    #: CPU, memory and uptime (STATS)
    STATS = "stats"
    #: where the task listens (LISTENING)
    LISTENING = "listening"
    #: the task's TCP connections and their bytes (SOCKETS)
    SOCKETS = "sockets"
    #: every thread's Python stack, and the running cell's hints (STACKS)
    STACKS = "stacks"
    #: end now, as a crash would
    CRASH = "crash"
    #: KeyboardInterrupt in the running cell (or cancel one not started)
    INTERRUPT = "interrupt"
    #: every target of a %%tf_px cell is ready: start its body
    GO = "go"
    #: a task sharing its process dies alone, as modelled: its server cut off (CUT); ASSIGN serves again
    CUT = "cut"


#: the ops a task handles on its reader thread, even while a cell runs
URGENT = frozenset(
    {
        Op.SLOW,
        Op.NOTE,
        Op.FREE_PORT,
        Op.STATS,
        Op.LISTENING,
        Op.SOCKETS,
        Op.STACKS,
        Op.CRASH,
        Op.INTERRUPT,
        Op.GO,
        Op.CUT,
    }
)


class Event(str, enum.Enum):
    """What a task tells its owner (an answer carries the request's ``id``)."""

    #: the process runs (pid, host, Python, where its bind guard keeps it)
    HELLO = "hello"
    #: TensorFlow's server core is imported: a spare, ready for a role
    WARM = "warm"
    #: the role is taken: the server serves
    READY = "ready"
    #: a role could not be taken; ``kind`` is PORT_IN_USE when another port may help
    ASSIGN_FAILED = "assign_failed"
    #: the process cannot serve at all (TensorFlow does not import); it ends
    FATAL = "fatal"
    PONG = "pong"
    #: an op failed (``message``)
    ERROR = "error"
    SLOWED = "slowed"
    FREE_PORT = "free_port"
    STATS = "stats"
    LISTENING = "listening"
    SOCKETS = "sockets"
    STACKS = "stacks"
    VARIABLES = "variables"
    ENV = "env"
    #: the server of a task sharing its process is cut off (``sockets`` cut)
    CUT = "cut"
    #: a %%tf_px cell's report(step=..., loss=...)
    REPORT = "report"
    #: a line a cell printed (``name``: stdout or stderr)
    STREAM = "stream"
    #: a cell's leading imports ran: it waits at its barrier for GO
    EXEC_READY = "exec_ready"
    #: a cell ended (``status`` ok or error)
    EXEC_DONE = "exec_done"
    #: the process ended (sent by the owner's reader, not by the task: ``code``)
    EXIT = "exit"


#: ``kind`` of an ASSIGN_FAILED whose port was taken (a fresh port may help)
PORT_IN_USE = "port_in_use"

# the names these had before the enums (launchers read them)
HELLO, WARM, READY, ASSIGN_FAILED, FATAL = (
    Event.HELLO,
    Event.WARM,
    Event.READY,
    Event.ASSIGN_FAILED,
    Event.FATAL,
)


def encode(message: dict[str, Any]) -> bytes:
    """One message as a single line of UTF-8 JSON."""
    return (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()


def decode(line: bytes) -> dict[str, Any] | None:
    """Parse one line; ``None`` for anything that is not a JSON object."""
    try:
        value = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def send(stream: BinaryIO, message: dict[str, Any]) -> None:
    stream.write(encode(message))
    stream.flush()
