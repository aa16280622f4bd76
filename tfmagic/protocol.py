"""The control channel between an owner (kernel or script) and a task process.

One JSON object per line, in both directions.  The owner writes *ops* to the
task's standard input; the task answers with *events* on a private copy of
its original standard output (its own prints go to its log).  Plain JSON over
a byte stream works the same over a local pipe, an SSH channel or a Spark
executor's pipe, and it can be read in a log when something goes wrong.

The channel is also the task's lifeline: when the owner goes away (even by
``kill -9``) the task reads end-of-file and ends itself and its process group.
"""

from __future__ import annotations

import json
from typing import Any, BinaryIO

#: Events a task sends while it comes up, in order.
HELLO, WARM, READY = "hello", "warm", "ready"
#: A role could not be taken; ``kind`` tells whether another port may help.
ASSIGN_FAILED = "assign_failed"
PORT_IN_USE = "port_in_use"
#: The process cannot serve at all (e.g. TensorFlow does not import); it ends.
FATAL = "fatal"


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
