"""One export's text, chosen by kind: what the command line, the magic and :func:`write_export` share."""

from __future__ import annotations

from ..errors import ExportError
from .kubernetes import kubernetes_manifests
from .shape import ClusterLike
from .slurm import slurm_script

#: What :func:`export`, :func:`~tfmagic.export.write_export` and the command line can write.
KINDS = ("slurm", "kubernetes", "tfjob")


def export(kind: str, cluster: ClusterLike, **options) -> str:
    """The text of one export: ``kind`` is ``slurm``, ``kubernetes`` or ``tfjob``.

    ``options`` are those of :func:`~tfmagic.export.slurm_script` or
    :func:`~tfmagic.export.kubernetes_manifests`.

    >>> export("tfjob", {"worker": 2}, image="registry.example/train:1").count("kind: TFJob")
    1
    """
    if kind == "slurm":
        return slurm_script(cluster, **options)
    if kind in ("kubernetes", "tfjob"):
        tfjob = options.pop("tfjob", False) or kind == "tfjob"
        return kubernetes_manifests(cluster, **options, tfjob=tfjob)
    raise ExportError(f"cannot export {kind!r}; choose one of {', '.join(KINDS)}")
