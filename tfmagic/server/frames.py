"""A dashboard frame as both kinds of page ask for it: the server's own pages and the class API.

The kernel draws while someone asks (:func:`records.frame` marks the cluster watched); the
text (``json``: frame number, header and table HTML) and the picture (``png``) are answered here,
once, for the handlers of :mod:`.handlers` and :mod:`.classapi`.
"""

from __future__ import annotations

import json
from pathlib import Path

from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..publish import valid_id
from . import records


def serve_frame(handler: web.RequestHandler, root: Path, rid: str, kind: str) -> None:
    """Answer a dashboard frame's text (``json``) or picture (``png``); asking marks it watched."""
    record = records.read(root, rid) if valid_id(rid) else None
    if record is None:
        raise web.HTTPError(404, f"no cluster {rid} on this server")
    info, png = records.frame(root, rid)
    handler.set_header("Cache-Control", "no-store")
    if kind == "png":
        if png is None:
            raise web.HTTPError(404, "no frame yet: the kernel draws one within a second of a page opening")
        if isinstance(handler, APIHandler):  # Jupyter's API handlers set JSON's type unless told
            handler.finish(png, set_content_type="image/png")
        else:
            handler.set_header("Content-Type", "image/png")
            handler.finish(png)
        return
    out = dict(info or {"frame": 0})
    if record.get("state") != "running":
        out["state"] = f"stopped ({record.get('why', '')})"
    handler.finish(json.dumps(out))
