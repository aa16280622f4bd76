"""Processes: what they cost, what they started, and that none outlives its owner.

- :mod:`~tfmagic.procs.owner`: everything this process started, ended at its exit;
- :mod:`~tfmagic.procs.tree`: a process's descendants (``/proc``) and the keeper that ends them;
- :mod:`~tfmagic.procs.stats`: CPU and memory (PSS beside RSS) as users should read them;
- :mod:`~tfmagic.procs.memory`: the lowest memory limit that applies to this process;
- :mod:`~tfmagic.procs.throttle`: a process made slow on purpose (``python -m tfmagic.procs.throttle``).

Nothing is imported here, so a task process that needs one module loads only that one.
"""
