"""Reading task logs: the end of a file, without reading all of it."""

from __future__ import annotations

import os


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
