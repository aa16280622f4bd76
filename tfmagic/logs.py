"""Reading task logs: the end of a file, without reading all of it."""

from __future__ import annotations

import os
import re


def read_tail(path: str, tail: int | None) -> str:
    """The last ``tail`` lines of a text file (all of it for ``None``; ``""`` if it is missing)."""
    try:
        with open(path, "rb") as f:
            if tail is None:
                data = f.read()
            else:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                block, data = 8192, b""
                while size > 0 and data.count(b"\n") <= tail:
                    step = min(block, size)
                    size -= step
                    f.seek(size)
                    data = f.read(step) + data
                    block *= 2
                data = b"\n".join(data.splitlines()[-tail:]) if tail else b""
    except (FileNotFoundError, IsADirectoryError):
        return ""
    return data.decode("utf-8", "replace")


#: protobuf's DebugString() marker, which ends the log line a message dump follows
_DUMP_START = re.compile(r"goo\.gle/debug\w*\s*$")


def without_native(text: str) -> tuple[str, int]:
    """``text`` without TensorFlow's, absl's and gRPC's own log lines; and how many were left out.

    A task's log holds what its programs print and tfmagic's ``tfmagic: ...``
    lines among TensorFlow's start-up noise (CUDA probes, CPU-feature notices,
    and, when a client connects, a whole ``SessionOptions`` protobuf dump).
    The seeds' readers looked in ``worker0.out`` for training progress; this
    is that view.  A native line that announces a protobuf dump
    (``... goo.gle/debugproto``; protobuf varies the word on purpose, so that
    nobody parses it) takes the dump's lines with it, up to the blank line
    that ends it.

    >>> without_native("I0000 00:00:1.5 12 x.cc:3] SessionOptions: goo.gle/debugproto\\n"
    ...                "device_count {\\n  key: \\"CPU\\"\\n}\\nallow_soft_placement: true\\n\\nstep 1 loss 0.5\\n")
    ('step 1 loss 0.5\\n', 6)
    """
    from .logfilter import is_native_log_line

    kept: list[str] = []
    hidden = 0
    previous_native = in_dump = False
    for line in text.splitlines(keepends=True):
        bare = line.rstrip("\r\n")
        if in_dump:
            hidden += 1
            in_dump = bare.strip() != ""
            previous_native = True
            continue
        if is_native_log_line(bare, previous_native):
            hidden += 1
            previous_native = True
            in_dump = _DUMP_START.search(bare) is not None
            continue
        previous_native = False
        kept.append(line)
    return "".join(kept), hidden
