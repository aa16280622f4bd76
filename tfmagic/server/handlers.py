"""The pages: the cluster list, a cluster's live dashboard, and their JSON and PNG behind them.

Every handler derives from Jupyter's own and is ``@web.authenticated`` and
``@authorized`` (resource ``kernels``, read): whoever may not read this
server's kernels sees none of it (pages redirect to the login, the data
answers 403).  Pages are plain HTML with a few lines of script that poll
the data; they work wherever a browser does (no widgets needed).
"""

from __future__ import annotations

import atexit
import html
import json
import os
import shutil
import time
from pathlib import Path

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ..publish import ENV_DIR, valid_id
from ..units import human_bytes
from ..webpage import dashboard_page, page
from . import records
from .frames import serve_frame


class _Handler(JupyterHandler):
    auth_resource = "kernels"

    @property
    def root(self) -> Path:
        return self.settings["tfmagic_dir"]

    def notebook_of(self, record: dict) -> str:
        return self.settings["tfmagic_notebooks"].get(record.get("kernel_id"), "") or record.get(
            "notebook", ""
        )

    async def refresh_notebooks(self) -> None:
        """Which notebook each of this server's kernels belongs to (the server's sessions know)."""
        try:
            sessions = await self.session_manager.list_sessions()
        except Exception:  # noqa: BLE001 - no session manager (a bare kernel server): kernels' own word
            return
        self.settings["tfmagic_notebooks"] = {
            s["kernel"]["id"]: s.get("path", "") for s in sessions if s.get("kernel")
        }

    def not_found(self, rid: str) -> None:
        """A clear 404 page: which cluster, why, and where the list is."""
        record = records.read(self.root, rid) if valid_id(rid) else None
        listing = url_path_join(self.base_url, "tfmagic/")
        if record is None:
            words = (
                f"There is no cluster {html.escape(rid)!s} on this server: it never existed here, or its "
                "record was removed after its kernel ended."
            )
            last = ""
        else:
            words = (
                f"Cluster {html.escape(record.get('cluster', rid))} ({html.escape(record.get('shape', ''))}) "
                f"of {html.escape(self.notebook_of(record) or 'a kernel')} has stopped "
                f"({html.escape(record.get('why', 'stopped'))}): there is nothing live to show. Start it again "
                "in its notebook (%tf_cluster start) and open it from the list."
            )
            last = (
                "<p class='muted'>Its last frame:</p><img class='tfmagic-frame' src='frame.png'>"
                if (self.root / f"{rid}.png").exists()
                else ""
            )
        self.set_status(404)
        self.finish(
            page(
                "tfmagic: no such cluster",
                f"<h2>No live cluster here</h2><p id='tfmagic-404'>{words}</p>"
                f"<p><a href='{html.escape(listing, quote=True)}'>All clusters of this server</a></p>{last}",
            )
        )


class ListPage(_Handler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        if not self.request.path.endswith("/"):
            self.redirect(self.request.path + "/")
            return
        await self.refresh_notebooks()
        rows = _rows(self, records.read_all(self.root))
        body = (
            "<h2>Clusters started by this server's kernels</h2>"
            "<table id='tfmagic-clusters'><thead><tr><th>notebook</th><th>cluster</th><th>shape</th>"
            "<th>state</th><th>memory (tasks' RSS)</th><th>training</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
            "<p class='muted'>A cluster appears here when a notebook of this server starts one "
            "(%tf_cluster start); the list refreshes itself.</p>"
        )
        script = (
            "setInterval(async () => { const r = await fetch('api/clusters', {cache: 'no-store'});"
            " if (r.ok) { document.querySelector('#tfmagic-clusters tbody').innerHTML ="
            " (await r.json()).rows; } }, 2000);"
        )
        self.finish(page("tfmagic clusters", body, script))


def _rows(handler: _Handler, recs: list[dict]) -> str:
    if not recs:
        return "<tr><td colspan='6' class='muted'>no cluster yet</td></tr>"
    out = []
    for r in recs:
        rid = r["id"]
        name = html.escape(str(r.get("cluster", rid)))
        live = r.get("state") == "running"
        link = f"<a href='cluster/{html.escape(rid, quote=True)}/'>{name}</a>" if live else name
        state = "running" if live else f"stopped ({r.get('why', '')})"
        memory = human_bytes(r["memory"]) if r.get("memory") else "-"
        cells = [
            html.escape(handler.notebook_of(r) or f"kernel {r.get('kernel_pid')}"),
            link,
            html.escape(str(r.get("shape", ""))),
            html.escape(state),
            html.escape(memory),
            html.escape(str(r.get("run") or "-")),
        ]
        out.append(
            f"<tr data-cluster='{html.escape(rid, quote=True)}'>"
            + "".join(f"<td>{c}</td>" for c in cells)
            + "</tr>"
        )
    return "".join(out)


class ListAPI(_Handler, APIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        await self.refresh_notebooks()
        recs = records.read_all(self.root)
        self.finish(json.dumps({"clusters": recs, "rows": _rows(self, recs)}))


class ClusterPage(_Handler):
    @web.authenticated
    @authorized
    async def get(self, rid: str) -> None:
        if not self.request.path.endswith("/"):
            self.redirect(self.request.path + "/")
            return
        record = records.read(self.root, rid) if valid_id(rid) else None
        if record is None or record.get("state") != "running":
            self.not_found(rid)
            return
        await self.refresh_notebooks()
        self.finish(
            dashboard_page(
                f"{record.get('cluster')} ({record.get('shape')})",
                self.notebook_of(record),
                url_path_join(self.base_url, "tfmagic/"),
                "all clusters",
            )
        )


class FrameAPI(_Handler, APIHandler):
    @web.authenticated
    @authorized
    async def get(self, rid: str, kind: str) -> None:
        serve_frame(self, self.root, rid, kind)


def setup(serverapp) -> None:
    """Make the private directory, hand it to future kernels, and add the handlers."""
    root = records.make_dir(getattr(serverapp, "runtime_dir", None))
    os.environ[ENV_DIR] = str(root)
    base = serverapp.base_url
    try:
        import jupyter_server_proxy  # noqa: F401 - present: TensorBoard is reached through it

        # TensorBoard's own %tensorboard and tfmagic.tensorboard.show() read this: the page reaches
        # TensorBoard through this server's proxy, behind its login, instead of a port of its own.
        os.environ.setdefault("TENSORBOARD_PROXY_URL", url_path_join(base, "proxy/%PORT%/"))
    except ImportError:
        serverapp.log.info(
            "tfmagic: jupyter-server-proxy is not installed; TensorBoard shows on its own port"
        )
    web_app = serverapp.web_app
    web_app.settings["tfmagic_dir"] = root
    web_app.settings["tfmagic_notebooks"] = {}
    rid = r"([^/]+)"
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "tfmagic/?"), ListPage),
            (url_path_join(base, "tfmagic/api/clusters"), ListAPI),
            (url_path_join(base, f"tfmagic/cluster/{rid}/frame\\.(json|png)"), FrameAPI),
            (url_path_join(base, f"tfmagic/cluster/{rid}/?"), ClusterPage),
        ],
    )
    _class_api(serverapp, web_app, base)
    atexit.register(shutil.rmtree, root, True)
    serverapp.log.info(
        "tfmagic: clusters of this server's kernels at %s (published in %s)",
        url_path_join(base, "tfmagic/"),
        root,
    )
    serverapp.web_app.settings["tfmagic_started"] = time.time()


def _class_api(serverapp, web_app, base: str) -> None:
    """On a JupyterHub: the read-only class API a teacher's tfmagic service asks (by scope)."""
    from . import classapi

    gate = classapi.Gate.from_env()
    if gate is None:
        return  # not started by a hub: no teacher to serve
    web_app.settings["tfmagic_gate"] = gate
    web_app.add_handlers(".*$", classapi.handlers(base, url_path_join))
    if not os.environ.get(classapi.ENV_SERVICE):
        serverapp.log.info(
            "tfmagic: this hub runs no tfmagic service (tfmagic.hub.configure in jupyterhub_config.py), "
            "so no teacher's class page reads this server; its own pages work as before"
        )


def teardown(serverapp) -> None:
    root = serverapp.web_app.settings.get("tfmagic_dir")
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
