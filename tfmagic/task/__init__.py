"""The program that runs inside every background task process, by job.

Started as ``python -m tfmagic.task_main`` by a launcher (local, SSH, ...),
it imports what a TensorFlow server needs at once (the server core: 0.6 s
and 0.37 GB here, against 4 s and 0.7 GB for all of ``import tensorflow``;
see :class:`ServerCore`), then waits, *warm*, for the owner to give
it a role (``assign``: a job, an index and the whole cluster's addresses).
That split is what makes a second ``%tf_cluster start`` fast: spare
processes have already paid the import and take a role in milliseconds.
TensorFlow's Python API (``tf`` in a ``%%tf_px`` cell) is completed the
first time something in this process needs it.

The process talks to its owner through :mod:`tfmagic.protocol` on its
standard input and a private copy of its standard output; everything the task
prints (TensorFlow's logs included) goes to its log file.  It ends itself and
everything it started (its descendants, also those a cell moved to a session
of their own: the task is their *child subreaper*, so orphans re-parent to it)
when

* its control channel reaches end-of-file (the owner died, even by ``kill -9``:
  the kernel holds the only write end of that pipe), or
* its parent process changes (a local owner died while a forked child of it
  still held the pipe open), or
* its parent dies while it is stopped (``TFMAGIC_PDEATHSIG=1``: the kernel
  sends SIGKILL; a stopped process cannot read end-of-file), or
* the owner sends ``stop``.

The control channel is moved off file descriptor 0 at start-up: a cell's
``input()``, ``breakpoint()`` or child process finds no input (an error that
says so, or ``/dev/null``), never the owner's ops.

It never forks after importing TensorFlow; code that needs another process
must spawn one.

The parts: :mod:`.runtime` (the channel, the role, the op loop),
:mod:`.server` (the server core and the server of a role), :mod:`.cells`
(``%%tf_px`` cells), :mod:`.probes` (urgent ops, answered while a cell runs),
:mod:`.lifeline` (ending with the owner, on every path), :mod:`.host` (one
process serving several tasks, ``processes=``) and :mod:`.main` (the start-up order).  Every message is named in :mod:`tfmagic.protocol`.
This package imports nothing at import time: a task loads only what it needs.
"""
