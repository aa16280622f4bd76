"""The class page: a hub-managed service at ``/services/tfmagic/`` that shows a teacher the class.

``python -m tfmagic.hub`` (started by the hub, configured by :func:`tfmagic.hub.configure`).  A
teacher logs in through the hub (OAuth); the token the hub gives this service for them holds what
the teachers' role grants, filtered to the class: ``custom:tfmagic:read!group=<class>``, reading
the class group's members and their servers.  With that token, and nothing of its own, the service
asks every student's server for its class API (:mod:`tfmagic.server.classapi`), which checks the
scope itself.  So the page shows what the teacher may read and nothing more: no kernel, no file, no
terminal of a student's is reachable from here, and a student (whose token holds no such scope)
gets 403 here and on every other student's class API.

Pages, all read-only:

* ``/services/tfmagic/``: every student of the class with their clusters (shape, state, memory and
  tasks against the hub's limits, the run in progress, its rate and loss), their latest experiment,
  and the class experiment's table and picture (every student's measured figures, how many held),
  refreshed every :data:`REFRESH_S` seconds;
* ``/services/tfmagic/student/<name>/cluster/<id>/``: a student's live dashboard, the frames relayed
  from their server.

This module imports JupyterHub (the service runs beside the hub); nothing else of tfmagic does.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import sys
from html.parser import HTMLParser
from urllib.parse import quote

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import httpserver, ioloop, web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ..webpage import dashboard_page, page
from . import ENV_EXPERIMENT, ENV_PROXY, ENV_STUDENTS, ENV_TEACHERS, SCOPE

#: seconds between a class page's refreshes
REFRESH_S = 2.0
#: seconds a student's server may take to answer before the page says it does not
ASK_TIMEOUT_S = 5.0
#: seconds between looks at the parent: the service ends when the hub that started it is gone
PARENT_CHECK_S = 1.0

_NAME = re.compile(r"^[^/?#\s]{1,255}$")


def reads_class(scopes) -> bool:
    """Whether a token's scopes hold tfmagic's read scope at all (filters are the students' to check)."""
    return any(str(s).partition("!")[0] == SCOPE for s in scopes or ())


class _Teacher(HubOAuthenticated, web.RequestHandler):
    """A handler for the class's teachers only: logged in through the hub, holding the read scope."""

    @property
    def cfg(self) -> dict:
        return self.settings["tfmagic"]

    def teacher(self) -> dict:
        user = self.current_user
        if not reads_class(user.get("scopes")):
            raise web.HTTPError(
                403,
                f"{user.get('name')} is not a teacher of {self.cfg['students']}: this page is for the "
                f"members of the group {self.cfg['teachers']} (their role gives {SCOPE})",
            )
        return user

    @property
    def token(self) -> str:
        return self.hub_auth.get_token(self)

    async def hub(self, path: str):
        """The hub's API, asked with the teacher's own token."""
        request = HTTPRequest(
            url_path_join(self.hub_auth.api_url, path),
            headers={"Authorization": f"token {self.token}"},
            request_timeout=ASK_TIMEOUT_S,
        )
        return json.loads((await AsyncHTTPClient().fetch(request)).body)

    async def ask_student(self, server_url: str, path: str, raw: bool = False):
        """A student's class API, asked with the teacher's token (the student's server checks the scope)."""
        request = HTTPRequest(
            self.cfg["proxy"].rstrip("/") + url_path_join(server_url, "tfmagic/api/class", path),
            headers={"Authorization": f"token {self.token}"},
            request_timeout=ASK_TIMEOUT_S,
        )
        response = await AsyncHTTPClient().fetch(request, raise_error=False)
        if raw:
            return response
        if response.code != 200:
            try:
                message = json.loads(response.body or b"{}").get("message")
            except ValueError:
                message = None
            raise _Unanswered(message or f"its server answered {response.code}")
        return json.loads(response.body)

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.finish(
            page("tfmagic: class", f"<h2>{status_code}</h2><p id='tfmagic-error'>{html.escape(message)}</p>")
        )


class _Unanswered(Exception):
    pass


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ClassPage(_Teacher):
    @web.authenticated
    async def get(self) -> None:
        self.teacher()
        cfg = self.cfg
        experiment = cfg["experiment"]
        assignment = (
            f"<p id='tfmagic-assignment'>The class experiment: <b>{html.escape(experiment)}</b>. Each student "
            f"runs <code>%tf_experiment {html.escape(experiment)} --seed N</code> with a seed of their own; "
            "the table fills as results arrive.</p>"
            if experiment
            else "<p class='muted'>No class experiment is named (tfmagic.hub.configure(..., experiment=...)): "
            "each student's latest experiment is listed.</p>"
        )
        body = (
            f"<h2>The class {html.escape(cfg['students'])}</h2>"
            "<table id='tfmagic-students'><thead><tr><th>student</th><th>server</th><th>cluster</th>"
            "<th>state</th><th>tasks / memory (limit)</th><th>training</th><th>latest experiment</th></tr></thead>"
            "<tbody><tr><td colspan='7' class='muted'>asking the students' servers...</td></tr></tbody></table>"
            f"<h3>The class experiment</h3>{assignment}"
            "<p id='tfmagic-verdict' class='muted'></p><div id='tfmagic-plot'></div>"
            "<table id='tfmagic-results'><thead></thead><tbody></tbody></table>"
            f"<p class='muted' id='tfmagic-updated'>refreshed every {REFRESH_S:g} s</p>"
        )
        script = _CLASS_SCRIPT.replace("XSRF_TOKEN", json.dumps(_text(self.xsrf_token))).replace(
            "REFRESH_MS", str(int(REFRESH_S * 1000))
        )
        self.finish(page(f"tfmagic: the class {cfg['students']}", body, script))


class ClassData(_Teacher):
    @web.authenticated
    async def get(self) -> None:
        self.teacher()
        cfg = self.cfg
        try:
            group = await self.hub(f"groups/{quote(cfg['students'], safe='')}")
        except HTTPClientError as exc:
            raise web.HTTPError(
                502 if exc.code != 404 else 404,
                f"the hub did not list the group {cfg['students']} ({exc}): does it exist, and does the "
                f"teachers' role read it?",
            ) from None
        names = sorted(group.get("users") or [])
        students = await asyncio.gather(*(self.student(name) for name in names))
        table = class_table(students, cfg["experiment"])
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"students": students, "experiment": cfg["experiment"], "table": table}))

    async def student(self, name: str) -> dict:
        out: dict = {"name": name, "server": "stopped", "clusters": [], "experiments": [], "usage": None}
        try:
            model = await self.hub(f"users/{quote(name, safe='')}")
        except HTTPClientError as exc:
            out["error"] = f"the hub did not say ({exc})"
            return out
        server = (model.get("servers") or {}).get("")
        if not server or not server.get("ready"):
            out["server"] = "starting" if server else "stopped"
            return out
        out["server"] = "running"
        out["url"] = server.get("url") or f"/user/{name}/"
        try:
            data = await self.ask_student(out["url"], "")
        except _Unanswered as exc:
            out["error"] = str(exc)
            return out
        except Exception as exc:  # noqa: BLE001 - one student's server down must not blank the class
            out["error"] = f"its server does not answer ({type(exc).__name__}: {exc})"
            return out
        out["clusters"] = [c for c in data.get("clusters") or [] if isinstance(c, dict)]
        out["experiments"] = [e for e in data.get("experiments") or [] if isinstance(e, dict)]
        out["usage"] = data.get("usage")
        return out


def class_table(students: list[dict], experiment: str | None) -> dict:
    """The class experiment as one table: each student's latest result of it, and how many held.

    >>> t = class_table([{"name": "a", "experiments": [{"experiment": "noise", "seed": 1, "holds": True,
    ...     "checks": [{"label": "ratio", "value": 2.0, "bound": 1.5, "op": ">=", "passed": True}]}]},
    ...     {"name": "b", "experiments": []}], "noise")
    >>> t["held"], t["ran"], t["students"], [r["name"] for r in t["rows"]]
    (1, 1, 2, ['a'])
    """
    rows = []
    for s in students:
        mine = [e for e in s.get("experiments") or [] if not experiment or e.get("experiment") == experiment]
        if mine:
            latest = max(mine, key=lambda e: float(e.get("finished_at") or 0))
            rows.append({"name": s["name"], **latest})
    labels: list[str] = []  # one per check: a label may be checked against two bounds (>= a, <= b)
    for r in rows:
        for c in r.get("checks") or []:
            c["key"] = f"{c.get('label')} {c.get('op')} {c.get('bound')}"
            if c["key"] not in labels:
                labels.append(c["key"])
    return {
        "experiment": experiment,
        "rows": rows,
        "labels": labels,
        "held": sum(1 for r in rows if r.get("holds")),
        "ran": len(rows),
        "students": len(students),
    }


class StudentDashboard(_Teacher):
    @web.authenticated
    async def get(self, name: str, rid: str) -> None:
        self.teacher()
        if not self.request.path.endswith("/"):
            self.redirect(self.request.path + "/")
            return
        self.finish(
            dashboard_page(
                f"{name}: cluster {rid}",
                "read-only, relayed from the student's server",
                "../../../../",  # student/<name>/cluster/<id>/ is four below the class page
                "the class",
                xsrf=_text(self.xsrf_token),
            )
        )


class StudentFrame(_Teacher):
    @web.authenticated
    async def get(self, name: str, rid: str, kind: str) -> None:
        self.teacher()
        if not _NAME.match(name):
            raise web.HTTPError(404, "no such student")
        server = url_path_join(self.cfg["base_url"], "user", quote(name, safe=""), "/")
        response = await self.ask_student(server, f"cluster/{quote(rid, safe='')}/frame.{kind}", raw=True)
        self.set_status(response.code if response.code in (200, 403, 404) else 502)
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")  # a picture is shown as one, whatever it holds
        if kind == "png" and response.code == 200:
            self.set_header("Content-Type", "image/png")
            self.finish(response.body)
            return
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(safe_frame(response.body)))


#: the tags a student's dashboard text may keep on a teacher's page (no attributes at all)
_KEPT_TAGS = {"table", "thead", "tbody", "tr", "th", "td", "div", "span", "b", "i", "br", "p", "code"}


class _Cleaner(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        if tag in _KEPT_TAGS:
            self.out.append(f"<{tag}>")

    def handle_endtag(self, tag) -> None:
        if tag in _KEPT_TAGS and tag != "br":
            self.out.append(f"</{tag}>")

    def handle_data(self, data) -> None:
        self.out.append(html.escape(data))


def clean_html(fragment: str) -> str:
    """A student's HTML fragment as a teacher's page may show it: a few layout tags, no attribute,
    every text escaped.  The frame's header and table come from the student's server, which the
    student controls; shown as they are, a script in them would act as the teacher on the hub.

    >>> clean_html("<div style='x'>3 <b>ok</b></div><img src=x onerror=alert(1)><script>alert(2)</script>")
    '<div>3 <b>ok</b></div>alert(2)'
    """
    cleaner = _Cleaner()
    cleaner.feed(str(fragment or ""))
    cleaner.close()
    return "".join(cleaner.out)


def safe_frame(body: bytes) -> dict:
    """A student's frame.json with its HTML cleaned (:func:`clean_html`) and nothing but known fields."""
    try:
        frame = json.loads(body or b"{}")
    except ValueError:
        frame = {}
    if not isinstance(frame, dict):
        frame = {}
    out = {"frame": frame.get("frame") if isinstance(frame.get("frame"), int) else 0}
    if isinstance(frame.get("time"), (int, float)):
        out["time"] = frame["time"]
    for key in ("state", "message"):
        if isinstance(frame.get(key), str):
            out[key] = frame[key]
    for key in ("header_html", "table_html"):
        out[key] = clean_html(frame.get(key, ""))
    return out


_CLASS_SCRIPT = r"""
const XSRF = XSRF_TOKEN;  // JupyterHub checks it on a page's script requests
const esc = (s) => String(s ?? '').replace(/[&<>"']/g, (c) => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));
const gb = (b) => b == null ? '-' : (b / 1e9).toFixed(2) + ' GB';
function usage(u) {
  if (!u) return '-';
  if (u.error) return '<span class="tfmagic-bad">' + esc(u.error) + '</span>';
  const t = u.tasks + (u.max_tasks ? ' of ' + u.max_tasks : '') + ' tasks';
  const m = gb(u.pss) + (u.max_memory ? ' of ' + gb(u.max_memory) : '');
  return esc(t + ', ' + m);
}
function training(c) {
  const hang = c.hang ? '<div class="tfmagic-bad tfmagic-hang">&#9888; ' + esc(c.hang) + '</div>' : '';
  if (!c.run) return hang || '-';
  let s = esc(c.run);
  if (c.run_rate) s += ', ' + c.run_rate.toFixed(1) + ' updates/s';
  if (c.run_loss != null) s += ', loss ' + Number(c.run_loss).toPrecision(3);
  return s + hang;
}
function latest(s) {
  const e = (s.experiments || [])[0];
  return e ? esc(e.experiment + ' (seed ' + e.seed + '): ' + (e.holds ? 'holds' : 'does not hold')) : '-';
}
function rows(students) {
  const out = [];
  for (const s of students) {
    const server = esc(s.server) + (s.error ? ' <span class="tfmagic-bad">' + esc(s.error) + '</span>' : '');
    const live = (s.clusters || []).filter((c) => c.state === 'running');
    const shown = live.length ? live : (s.clusters || []).slice(0, 1);
    if (!shown.length) {
      out.push(`<tr data-student="${esc(s.name)}"><td>${esc(s.name)}</td><td>${server}</td><td class="muted">no cluster</td><td></td><td>${usage(s.usage)}</td><td></td><td>${latest(s)}</td></tr>`);
      continue;
    }
    for (const c of shown) {
      const link = c.state === 'running'
        ? `<a href="student/${encodeURIComponent(s.name)}/cluster/${encodeURIComponent(c.id)}/">${esc(c.cluster)}</a>` : esc(c.cluster);
      const state = c.state === 'running' ? 'running' : 'stopped (' + esc(c.why || '') + ')';
      out.push(`<tr data-student="${esc(s.name)}" data-cluster="${esc(c.id)}"><td>${esc(s.name)}</td><td>${server}</td><td>${link} ${esc(c.shape)}</td><td>${state}</td><td>${usage(s.usage)}</td><td>${training(c)}</td><td>${latest(s)}</td></tr>`);
    }
  }
  return out.join('') || '<tr><td colspan="7" class="muted">the class group has no members</td></tr>';
}
function plot(t) {
  // one strip per check: every student's measured value as a dot, the claim's bound as a line
  const W = 640, H = 66, pad = 20;
  let svg = '';
  t.labels.forEach((label, i) => {
    const pts = t.rows.map((r) => [(r.checks || []).find((c) => c.key === label), r.name]).filter((p) => p[0] && p[0].value != null);
    if (!pts.length) return;
    const vals = pts.map((p) => p[0].value).concat([pts[0][0].bound]);
    let lo = Math.min(...vals), hi = Math.max(...vals);
    if (hi - lo < 1e-9) { lo -= 1; hi += 1; }
    const x = (v) => pad + (W - pad - 20) * (v - lo) / (hi - lo);
    const y = i * H + 38;
    svg += `<text x="${pad}" y="${y - 18}" font-size="12">${esc(label)}</text>`;
    svg += `<line x1="${pad}" x2="${W - 20}" y1="${y}" y2="${y}" stroke="#ccc"/>`;
    // the strip's scale: its two ends in numbers
    svg += `<text x="${pad}" y="${y + 20}" font-size="10" fill="#777">${esc(lo.toPrecision(3))}</text>`;
    svg += `<text x="${W - 20}" y="${y + 20}" font-size="10" fill="#777" text-anchor="end">${esc(hi.toPrecision(3))}</text>`;
    const b = x(pts[0][0].bound);
    svg += `<line class="tfmagic-bound" x1="${b}" x2="${b}" y1="${y - 14}" y2="${y + 14}" stroke="#555" stroke-dasharray="3,2"><title>the claim: ${esc(pts[0][0].op)} ${esc(pts[0][0].bound)}</title></line>`;
    for (const [c, name] of pts) {
      svg += `<circle class="tfmagic-dot" cx="${x(c.value)}" cy="${y}" r="5" fill="${c.passed ? '#1b5e20' : '#b00020'}"><title>${esc(name)}: ${esc(Number(c.value).toPrecision(3))}</title></circle>`;
    }
  });
  return svg ? `<svg id="tfmagic-strips" width="${W}" height="${t.labels.length * H}">${svg}</svg>` : '';
}
function results(t) {
  const head = '<tr><th>student</th><th>seed</th><th>verdict</th>' + t.labels.map((l) => `<th>${esc(l)}</th>`).join('') + '</tr>';
  const body = t.rows.map((r) => {
    const cells = t.labels.map((l) => {
      const c = (r.checks || []).find((k) => k.key === l);
      return c ? `<td class="${c.passed ? 'tfmagic-good' : 'tfmagic-bad'}">${c.value == null ? '-' : esc(Number(c.value).toPrecision(3))}</td>` : '<td>-</td>';
    }).join('');
    const verdict = r.holds ? 'holds' : 'does not hold' + (r.why ? ': ' + esc(r.why) : '');
    return `<tr data-student="${esc(r.name)}"><td>${esc(r.name)}</td><td>${esc(r.seed)}</td><td>${verdict}</td>${cells}</tr>`;
  }).join('');
  return [head, body];
}
async function refresh() {
  try {
    const r = await fetch('api/class', {cache: 'no-store', headers: {'X-XSRFToken': XSRF}});
    if (!r.ok) { document.getElementById('tfmagic-updated').textContent = 'the service answered ' + r.status; return; }
    const d = await r.json();
    document.querySelector('#tfmagic-students tbody').innerHTML = rows(d.students);
    const t = d.table;
    document.getElementById('tfmagic-verdict').textContent = t.ran
      ? `${t.held} of ${t.ran} students' runs hold (${t.students - t.ran} of ${t.students} have not run it yet)`
      : `no student has run it yet (${t.students} in the class)`;
    document.getElementById('tfmagic-plot').innerHTML = plot(t);
    const [head, body] = results(t);
    document.querySelector('#tfmagic-results thead').innerHTML = head;
    document.querySelector('#tfmagic-results tbody').innerHTML = body;
    document.getElementById('tfmagic-updated').textContent = 'refreshed ' + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById('tfmagic-updated').textContent = 'the service does not answer: ' + e;
  }
}
refresh();
setInterval(refresh, REFRESH_MS);
"""


def make_app(prefix: str, cfg: dict) -> web.Application:
    student = r"([^/]+)"
    return web.Application(
        [
            (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
            (prefix, ClassPage),
            (url_path_join(prefix, "api/class"), ClassData),
            (url_path_join(prefix, rf"student/{student}/cluster/{student}/?"), StudentDashboard),
            (url_path_join(prefix, rf"student/{student}/cluster/{student}/frame\.(json|png)"), StudentFrame),
        ],
        cookie_secret=os.urandom(32),
        tfmagic=cfg,
    )


def config_from_env(env=os.environ) -> dict:
    """What :func:`tfmagic.hub.configure` put in the service's environment."""
    missing = [k for k in (ENV_TEACHERS, ENV_STUDENTS, ENV_PROXY, "JUPYTERHUB_SERVICE_URL") if not env.get(k)]
    if missing:
        raise SystemExit(
            f"tfmagic.hub: {', '.join(missing)} not set: start this service from the hub, configured with "
            "tfmagic.hub.configure(c, teachers=..., students=...) in jupyterhub_config.py"
        )
    return {
        "name": env.get("JUPYTERHUB_SERVICE_NAME", "tfmagic"),
        "teachers": env[ENV_TEACHERS],
        "students": env[ENV_STUDENTS],
        "experiment": env.get(ENV_EXPERIMENT) or None,
        "proxy": env[ENV_PROXY],
        "url": env["JUPYTERHUB_SERVICE_URL"],
        "base_url": env.get("JUPYTERHUB_BASE_URL") or "/",
    }


async def check_groups(cfg: dict, api_url: str, token: str) -> list[str]:
    """One line for each group that would leave the page empty (missing or without members)."""
    lines = []
    for label, group in (("teachers", cfg["teachers"]), ("students", cfg["students"])):
        request = HTTPRequest(
            url_path_join(api_url, "groups", quote(group, safe="")),
            headers={"Authorization": f"token {token}"},
            request_timeout=ASK_TIMEOUT_S,
        )
        try:
            members = json.loads((await AsyncHTTPClient().fetch(request)).body).get("users") or []
        except HTTPClientError as exc:
            if exc.code == 404:
                lines.append(
                    f"tfmagic.hub: the {label}' group {group!r} does not exist on this hub: make it "
                    "(c.JupyterHub.load_groups or the admin page) or name another in tfmagic.hub.configure"
                )
            else:
                lines.append(f"tfmagic.hub: cannot read the {label}' group {group!r} ({exc})")
            continue
        except Exception as exc:  # noqa: BLE001 - said, not fatal: the page says it again to whoever opens it
            lines.append(f"tfmagic.hub: cannot read the {label}' group {group!r} ({exc})")
            continue
        if not members:
            lines.append(
                f"tfmagic.hub: the {label}' group {group!r} has no members (the hub makes a group a role names, "
                "empty, when none of that name existed): add them with c.JupyterHub.load_groups or the admin page"
            )
    return lines


def main() -> None:
    from urllib.parse import urlparse

    cfg = config_from_env()
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/tfmagic/")
    app = make_app(prefix, cfg)
    where = urlparse(cfg["url"])
    server = httpserver.HTTPServer(app)
    server.listen(where.port or 80, where.hostname or "127.0.0.1")
    print(f"tfmagic.hub: the class page of {cfg['students']} for {cfg['teachers']} at {prefix}", flush=True)
    loop = ioloop.IOLoop.current()
    api, token = os.environ.get("JUPYTERHUB_API_URL"), os.environ.get("JUPYTERHUB_API_TOKEN")
    if api and token:

        async def say():
            for line in await check_groups(cfg, api, token):
                print(line, file=sys.stderr, flush=True)

        loop.add_callback(say)
    parent = os.getppid()

    def orphaned() -> None:  # the hub died without stopping its services (kill -9): end with it
        if os.getppid() != parent:
            print(
                "tfmagic.hub: the hub that started this service is gone; ending", file=sys.stderr, flush=True
            )
            loop.stop()

    ioloop.PeriodicCallback(orphaned, PARENT_CHECK_S * 1000).start()
    try:
        loop.start()
    except KeyboardInterrupt:  # the hub ends its services with SIGINT: a stop, not a failure
        pass
