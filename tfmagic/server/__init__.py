"""tfmagic's pages in the Jupyter server: ``<base_url>tfmagic/``, every cluster this server's kernels started.

Enabled by installing tfmagic (``jupyter-config/jupyter_server_config.d/tfmagic.json``
is installed into ``etc/jupyter``); it lives behind the server's own login
and base URL, on the server's port.  The kernels publish (:mod:`tfmagic.publish`),
these handlers only read what they wrote, from a private directory the
server makes and hands to its kernels in their environment.  This package
is the only part of tfmagic that imports jupyter_server.
"""

from __future__ import annotations


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "tfmagic.server"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from .handlers import setup

    setup(serverapp)


def _unload_jupyter_server_extension(serverapp) -> None:
    from .handlers import teardown

    teardown(serverapp)
