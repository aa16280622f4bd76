"""Checks of the options every export takes, before any text is written.

An exported file runs later, on another machine, often after a wait in a
queue; a bad port or a program argument split the wrong way would only show
there.  So options are checked here, and each error says what to pass instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ExportError


def check_port(port: int, span: int = 1) -> None:
    """``port`` .. ``port + span - 1`` must all be TCP ports."""
    if isinstance(port, bool) or not isinstance(port, int) or port < 1 or port + span - 1 > 65535:
        need = f"ports {port}..{port + span - 1}" if isinstance(port, int) and span > 1 else "a port"
        raise ExportError(
            f"port {port!r} does not fit: the tasks need {need} within 1..65535; "
            "pick a free port such as 2222 or 8888"
        )


def check_count(name: str, value: int) -> None:
    """A count of GPUs or tasks: a whole number, 0 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExportError(f"{name} must be a whole number, 0 or more, not {value!r}")


def check_args(program_args: Sequence[str]) -> None:
    """The program's arguments: a list of strings (one string would be split into characters)."""
    if isinstance(program_args, str) or not all(isinstance(a, str) for a in program_args):
        raise ExportError(
            f"program_args must be a list of strings, one per argument, not {program_args!r}; "
            "for example ['--epochs', '3']"
        )


def one_line(name: str, value: str) -> str:
    """Text that goes into a command line or a header: one non-empty line."""
    if not isinstance(value, str) or not value.strip() or "\n" in value or "\r" in value:
        raise ExportError(f"{name} must be one line of text, not {value!r}")
    return value
