"""Export a cluster description to engines tfmagic cannot run here: Slurm and Kubernetes.

A local cluster is for learning and trying; the same ps/worker layout then has
to run where the machines are.  This package turns a cluster description (a
:class:`~tfmagic.spec.ClusterShape`, a :class:`~tfmagic.spec.ClusterDef` or a
``{job: count}`` mapping) into files those engines take as they are:

* :func:`slurm_script` (:mod:`.slurm`): a batch script for ``sbatch`` with one
  ``srun`` step whose Slurm tasks become the TensorFlow tasks, through
  TensorFlow's own ``SlurmClusterResolver``;
* :func:`kubernetes_manifests` (:mod:`.kubernetes`): a headless Service and a
  Pod per task, each Pod with its ``TF_CONFIG``; or, with ``tfjob=True``, one
  Kubeflow ``TFJob``;
* :func:`export` and :func:`write_export`: either one by kind, as text or into
  a file that is never replaced unless asked for (:mod:`.files`);
* ``tfmagic export slurm|k8s|tfjob`` (:mod:`.cli`): the same from a shell.

Both engines run one small launcher in every task: :mod:`.launch`, a module
of this package that needs only the standard library and TensorFlow, whose
source text (:data:`LAUNCHER`) the exported files carry.  It finds out which
task it is, sets ``TF_CONFIG``, starts the task's ``tf.distribute.Server``
where the strategy wants one, keeps ps tasks serving until every task running
the program has finished, and runs your program in the others.  The program
therefore reads ``TF_CONFIG`` the same way on Slurm, on Kubernetes and in a
tfmagic task.

>>> from tfmagic.spec import ClusterShape
>>> script = slurm_script(ClusterShape(ps=1, workers=2), program="train.py")
>>> "#SBATCH --ntasks=3" in script
True

Nothing here imports TensorFlow or talks to Slurm or Kubernetes.  The output is
checked by tests (parsed, ``bash -n``, read back by TensorFlow's resolvers in a
simulated allocation); a Slurm script is also submitted with ``sbatch`` to a real
one-node Slurm and trains (``tests/test_slurm.py``).  The Kubernetes files have not
been run on a real cluster; ``docs/export.md`` says what was checked and how.
"""

from __future__ import annotations

from .files import write_export
from .kubernetes import LAUNCHER_DIR, kubernetes_manifests, kubernetes_tf_configs, task_dns_name
from .render import KINDS, export
from .shape import STRATEGIES, job_counts, roles
from .slurm import slurm_script
from .source import launcher_source
from .yamldump import to_yaml

#: The launcher's source text (the file ``tfmagic/export/launch.py``), as every export carries it.
LAUNCHER = launcher_source()

__all__ = [
    "KINDS",
    "LAUNCHER",
    "LAUNCHER_DIR",
    "STRATEGIES",
    "export",
    "job_counts",
    "kubernetes_manifests",
    "kubernetes_tf_configs",
    "roles",
    "slurm_script",
    "task_dns_name",
    "to_yaml",
    "write_export",
]
