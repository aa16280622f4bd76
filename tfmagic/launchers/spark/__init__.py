"""Task processes as Spark tasks: one barrier job runs the whole cluster.

``tfmagic.SparkCluster("local[3]", ps=1, workers=2)`` (or ``%tf_cluster
start --backend spark --master spark://host:7077``) submits one Spark job in
*barrier mode* with one Spark task per TensorFlow task.  Barrier mode is
Spark's gang scheduling: all tasks start together or none does, and if one
fails Spark kills the others, so a half-started cluster cannot hang around.
The application and its job show in the Spark UI as long as the cluster runs.

Each Spark task runs a small relay (:mod:`tfmagic.launchers.spark_task`) that
connects back to a listener in this process, authenticates, and starts the
TensorFlow task process as its child; from then on the task speaks
:mod:`tfmagic.protocol` to this process exactly as a local task does over its
pipes, and its log is written to a file on *this* machine.

The parts, one module each:

* :mod:`.context`: Spark's JVM (started here, without pyspark's fork-time
  Python code) and the SparkContext every Spark launcher of the process shares;
* :mod:`.relay`: the authenticated listener the relays connect back to, with
  its bounds on what a stranger can cost, and the log connections' reader;
* :mod:`.jobs`: the Spark jobs (:class:`Batch`) and the task slots
  (:class:`Slot`) they serve: submitting, waiting for them, cancelling;
* :mod:`.launcher`: :class:`SparkLauncher`, the launcher contract composed of those.

Lifetimes, all tested:

* ``cluster.stop()`` ends each task, the relays return, the job finishes, and
  the Spark application this launcher created ends too.
* The Spark job cancelled (Spark UI's *kill*, ``sc.cancelJobGroup``): Spark
  kills the relays, the tasks read end-of-file on their standard input and
  end; a task that cannot read (stopped with SIGSTOP) is killed by the kernel
  when its relay dies (``PR_SET_PDEATHSIG``).
* The driver (this process) dies, even by ``kill -9``: the relays' connections
  end and so do the tasks, within a second; the executors end the relays.

Security: the control channel carries code (``%%tf_px``), so only relays that
prove they hold a per-cluster secret are accepted; anyone else is refused and
counted (see :mod:`.relay`).  The channel is authenticated, not encrypted: on
a network you do not trust, also turn on Spark's own ``spark.authenticate``
and ``spark.network.crypto.enabled``.  The TensorFlow servers themselves run
any graph sent to them; each is kept on the one address its spec names (the
bind guard, built on its own host) unless ``guard=False``.
"""

from __future__ import annotations

from .context import DEFAULT_CONF, INSTALL_HINT, check_java, import_pyspark
from .jobs import Batch, Slot
from .launcher import SparkLauncher
from .relay import HANDSHAKE_SECONDS, MAX_HANDSHAKES, Refusal, Relay

#: The names :mod:`tfmagic.backends` (and older code) call.
_import_pyspark = import_pyspark
_check_java = check_java

__all__ = [
    "DEFAULT_CONF",
    "HANDSHAKE_SECONDS",
    "INSTALL_HINT",
    "MAX_HANDSHAKES",
    "Batch",
    "Refusal",
    "Relay",
    "Slot",
    "SparkLauncher",
    "check_java",
    "import_pyspark",
]
