"""The HTML both of tfmagic's web surfaces draw: a page's frame, and the live dashboard page.

The Jupyter server's pages (:mod:`tfmagic.server`) and a hub's class service
(:mod:`tfmagic.hub`) show the same dashboard from the same published frames, so
the page and its few lines of script live here, once (standard library only:
the class service runs where no TensorFlow and no Jupyter server need be).
The dashboard page polls ``frame.json`` beside it and loads ``frame.png?n=``
when a new frame is there; whoever serves the page serves those two.
"""

from __future__ import annotations

import html
import json

#: how often a dashboard page asks for a new frame (the kernel draws at most 4 a second)
POLL_MS = 200

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; } th, td { text-align: left; padding: 2px 10px; }
tr:nth-child(even) { background: #f4f4f4; } .muted { color: #777; }
img.tfmagic-frame { width: 100%; max-width: 1100px; }
.tfmagic-bad { color: #b00020; } .tfmagic-good { color: #1b5e20; }
"""


def page(title: str, body: str, script: str = "") -> str:
    """A whole page: ``body`` (HTML, already escaped) and ``script`` (JavaScript) in tfmagic's style."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>{body}"
        + (f"<script>{script}</script>" if script else "")
        + "</body></html>"
    )


def dashboard_page(title: str, subtitle: str, back_href: str, back_text: str, xsrf: str = "") -> str:
    """A cluster's live dashboard: the kernel's latest frame, its header and task table, polled.

    ``xsrf``: a token the page's requests carry (``X-XSRFToken``), for servers that check it on
    script requests (a JupyterHub service does).
    """
    body = (
        f"<h2>{html.escape(title)} <span class='muted'>{html.escape(subtitle)}</span></h2>"
        "<div id='tfmagic-header' class='tfmagic-header'>waiting for the kernel's first frame...</div>"
        "<img id='tfmagic-frame' class='tfmagic-frame' alt='the dashboard' data-frame='0'>"
        "<div id='tfmagic-table'></div><p id='tfmagic-state' class='muted'></p>"
        f"<p><a href='{html.escape(back_href, quote=True)}'>{html.escape(back_text)}</a></p>"
    )
    script = _DASHBOARD_SCRIPT % {
        "poll_ms": POLL_MS,
        "headers": json.dumps({"X-XSRFToken": xsrf} if xsrf else {}),
    }
    return page(f"tfmagic: {title}", body, script)


_DASHBOARD_SCRIPT = """
const img = document.getElementById('tfmagic-frame');
let shown = 0, busy = false;
async function poll() {
  if (busy) return;
  busy = true;
  try {
    const r = await fetch('frame.json', {cache: 'no-store', headers: %(headers)s});
    if (r.status === 404) {
      document.getElementById('tfmagic-state').textContent = (await r.json()).message;
      return;
    }
    const f = await r.json();
    if (f.frame && f.frame !== shown) {
      shown = f.frame;
      img.src = 'frame.png?n=' + f.frame;
      img.dataset.frame = String(f.frame);
      document.getElementById('tfmagic-header').innerHTML = f.header_html;
      document.getElementById('tfmagic-table').innerHTML = f.table_html;
      document.getElementById('tfmagic-state').textContent =
        'frame ' + f.frame + ', drawn ' + new Date(f.time * 1000).toLocaleTimeString() + (f.state === 'running' ? '' : ' (cluster ' + f.state + ')');
    }
  } catch (e) {
    document.getElementById('tfmagic-state').textContent = 'the server does not answer: ' + e;
  } finally { busy = false; }
}
poll();
setInterval(poll, %(poll_ms)d);
"""
