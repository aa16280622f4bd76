"""``python -m tfmagic.task_main``: the program inside every task process (see :mod:`tfmagic.task`).

The launchers start this module by name (locally, over SSH, in a Spark
executor); the program itself is the :mod:`tfmagic.task` package.
"""

from __future__ import annotations

from .task.main import main

if __name__ == "__main__":
    main()
