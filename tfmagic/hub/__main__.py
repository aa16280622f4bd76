"""``python -m tfmagic.hub``: the class page, as the hub starts it (see :mod:`tfmagic.hub.service`)."""

from .service import main

main()
