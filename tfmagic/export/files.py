"""Writing an export to a file without losing work that was there.

An exported script is often edited by hand afterwards (a partition, a module
line), so an existing file is never replaced unless asked for, and replacing it
keeps its mode, owner and links.  Every way writing can fail ends in one
:class:`~tfmagic.errors.ExportError` line saying what was wrong and what to do:
the callers (the command line and ``%tf_cluster export``) show it as it is.
"""

from __future__ import annotations

import errno
import os
import shlex
from pathlib import Path

from ..errors import ExportError
from .render import export
from .shape import ClusterLike

_FULL = (errno.ENOSPC, errno.EDQUOT)


def write_export(kind: str, path: str | Path, cluster: ClusterLike, force: bool = False, **options) -> Path:
    """Write :func:`~tfmagic.export.export` to ``path`` and return the path.

    An existing ``path`` is refused unless ``force=True`` (``--force``); with
    it the file is overwritten in place, so it keeps its mode, owner and hard
    links.  A new Slurm script is created executable (``0o777`` less the
    umask), so that ``./job.sbatch`` also runs it on a machine at hand;
    ``sbatch`` itself does not need that.  Other new files get ``0o666`` less
    the umask.  The text is made before the file is touched, so bad options
    leave nothing behind, and a write that fails half-way removes the file it
    created.

    >>> write_export("slurm", "job.sbatch", ClusterShape(ps=1, workers=2), partition="cpu")  # doctest: +SKIP
    PosixPath('job.sbatch')
    """
    text = export(kind, cluster, **options)
    path = Path(path)
    _check_place(path, kind)
    existed = os.path.lexists(path)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o777 if kind == "slurm" else 0o666)
    except FileExistsError:
        raise ExportError(
            f"{path} exists already; pass --force (force=True from Python) to replace it, "
            "or choose another path"
        )
    except IsADirectoryError:
        raise ExportError(_is_a_directory(path, kind))
    except NotADirectoryError:
        raise ExportError(
            f"cannot write {path}: part of its directory is a file; choose a path in a directory"
        )
    except FileNotFoundError as exc:  # the directory is there but takes no new files (/proc)
        raise ExportError(
            f"cannot write {path}: {path.parent} takes no new files ({exc.strerror}); choose another path"
        )
    except PermissionError:
        raise ExportError(
            f"cannot write {path}: permission denied (the file or its directory is not yours to write); "
            "choose another path, such as one in your home directory"
        )
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}; choose another path")
    created = not (force and existed)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)
    except OSError as exc:
        if created:
            path.unlink(missing_ok=True)
        left = "removed what was written" if created else "the file is incomplete now; write it again"
        todo = "free some space or choose another path" if exc.errno in _FULL else "choose another path"
        raise ExportError(f"writing {path} failed: {exc.strerror or exc} ({left}); {todo}")
    return path


def _is_a_directory(path: Path, kind: str) -> str:
    example = path / ("job.sbatch" if kind == "slurm" else f"{kind}.yaml")
    return f"{path} is a directory; give a file name in it, e.g. {example}"


def _check_place(path: Path, kind: str) -> None:
    """Refuse a directory, or a path whose directory is missing or a file, before opening anything."""
    if path.is_dir():
        raise ExportError(_is_a_directory(path, kind))
    parent = path.parent
    if parent.is_dir():
        return
    for ancestor in (parent, *parent.parents):
        if os.path.lexists(ancestor):
            if not ancestor.is_dir():
                raise ExportError(
                    f"cannot write {path}: {ancestor} is a file, not a directory; choose a path in a directory"
                )
            break
    raise ExportError(
        f"cannot write {path}: the directory {parent} does not exist; create it first "
        f"(mkdir -p {shlex.quote(str(parent))}) or choose another path"
    )
