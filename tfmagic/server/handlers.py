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
from . import records

#: how often a dashboard page asks for a new frame (the kernel draws at most 4 a second)
POLL_MS = 200

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; } th, td { text-align: left; padding: 2px 10px; }
tr:nth-child(even) { background: #f4f4f4; } .muted { color: #777; }
img.tfmagic-frame { width: 100%; max-width: 1100px; }
"""


def _page(title: str, body: str, script: str = "") -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body>{body}"
        + (f"<script>{script}</script>" if script else "")
        + "</body></html>"
    )


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
            _page(
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
        self.finish(_page("tfmagic clusters", body, script))


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
        title = f"{record.get('cluster')} ({record.get('shape')})"
        body = (
            f"<h2>{html.escape(title)} <span class='muted'>{html.escape(self.notebook_of(record))}</span></h2>"
            "<div id='tfmagic-header' class='tfmagic-header'>waiting for the kernel's first frame...</div>"
            "<img id='tfmagic-frame' class='tfmagic-frame' alt='the dashboard' data-frame='0'>"
            "<div id='tfmagic-table'></div><p id='tfmagic-state' class='muted'></p>"
            f"<p><a href='{html.escape(url_path_join(self.base_url, 'tfmagic/'), quote=True)}'>all clusters</a></p>"
        )
        script = f"""
const img = document.getElementById('tfmagic-frame');
let shown = 0, busy = false;
async function poll() {{
  if (busy) return;
  busy = true;
  try {{
    const r = await fetch('frame.json', {{cache: 'no-store'}});
    if (r.status === 404) {{
      document.getElementById('tfmagic-state').textContent = (await r.json()).message;
      return;
    }}
    const f = await r.json();
    if (f.frame && f.frame !== shown) {{
      shown = f.frame;
      img.src = 'frame.png?n=' + f.frame;
      img.dataset.frame = String(f.frame);
      document.getElementById('tfmagic-header').innerHTML = f.header_html;
      document.getElementById('tfmagic-table').innerHTML = f.table_html;
      document.getElementById('tfmagic-state').textContent =
        'frame ' + f.frame + ', drawn ' + new Date(f.time * 1000).toLocaleTimeString() + (f.state === 'running' ? '' : ' (cluster ' + f.state + ')');
    }}
  }} catch (e) {{
    document.getElementById('tfmagic-state').textContent = 'the server does not answer: ' + e;
  }} finally {{ busy = false; }}
}}
poll();
setInterval(poll, {POLL_MS});
"""
        self.finish(_page(f"tfmagic: {title}", body, script))


class FrameAPI(_Handler, APIHandler):
    @web.authenticated
    @authorized
    async def get(self, rid: str, kind: str) -> None:
        record = records.read(self.root, rid) if valid_id(rid) else None
        if record is None:
            raise web.HTTPError(404, f"no cluster {rid} on this server")
        info, png = records.frame(self.root, rid)
        self.set_header("Cache-Control", "no-store")
        if kind == "png":
            if png is None:
                raise web.HTTPError(
                    404, "no frame yet: the kernel draws one within a second of a page opening"
                )
            self.finish(png, set_content_type="image/png")
            return
        out = dict(info or {"frame": 0})
        if record.get("state") != "running":
            out["state"] = f"stopped ({record.get('why', '')})"
        self.finish(json.dumps(out))


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
    atexit.register(shutil.rmtree, root, True)
    serverapp.log.info(
        "tfmagic: clusters of this server's kernels at %s (published in %s)",
        url_path_join(base, "tfmagic/"),
        root,
    )
    serverapp.web_app.settings["tfmagic_started"] = time.time()


def teardown(serverapp) -> None:
    root = serverapp.web_app.settings.get("tfmagic_dir")
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
