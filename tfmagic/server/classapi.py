"""What a class's teachers may read of a student's tfmagic on a JupyterHub: by scope, read-only.

On a hub a teacher holds no access to a student's server (``access:servers``): that would open the
student's kernels and files.  The hub's admin gives the teachers a custom scope instead,
``custom:tfmagic:read!group=<class>`` (:func:`tfmagic.hub.configure`), and this API, served by each
student's server at ``<base_url>tfmagic/api/class``, checks it itself:

* the caller sends a hub token (``Authorization: token ...``); the hub says whose it is and what it
  may do (``GET <hub>/api/user`` with that token);
* it may read when one of its scopes is ``custom:tfmagic:read`` unfiltered, or filtered to this
  server's user (``!user=``), this server (``!server=``) or a group this user belongs to
  (``!group=``; the server asks the hub for its own user's groups with its own token).
  Anything else, no token, or a token the hub does not know: 403, and nothing is read.

What it answers is what the server's own pages show of this user's clusters (their records and the
latest dashboard frame of one, which makes the kernel draw while someone looks), the experiments'
results the kernels published, and the user's tfmagic tasks against the hub's limits.  Nothing
here starts, stops or runs anything, and no kernel, file or terminal is reachable through it.

The hub's answers are kept :data:`KEEP_S` seconds per token (a class page asks every few seconds).
The API exists only in a server the hub started (``JUPYTERHUB_API_URL`` in its environment).
"""

from __future__ import annotations

import json
import os
import time

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ..procs import quota
from . import records
from .frames import serve_frame

#: the scope a teacher's token must hold (with a filter naming this student, their server or a group of theirs)
SCOPE = "custom:tfmagic:read"
#: set in every single-user server's environment by :func:`tfmagic.hub.configure`: the service's name
ENV_SERVICE = "TFMAGIC_HUB_SERVICE"
#: seconds a token's verdict (and this user's groups) are kept before the hub is asked again
KEEP_S = 30.0


def grants(scopes, user: str, server: str, groups) -> bool:
    """Whether ``scopes`` (a hub token's) let their holder read ``user``'s tfmagic.

    >>> grants(["custom:tfmagic:read!group=class-2026"], "alice", "", {"class-2026"})
    True
    >>> grants(["custom:tfmagic:read!group=class-2026"], "bob", "", {"other"})
    False
    >>> grants(["custom:tfmagic:read!user=alice", "access:servers!user=bob"], "bob", "", set())
    False
    >>> grants(["custom:tfmagic:read"], "bob", "", set())
    True
    """
    for scope in scopes or ():
        base, _, where = str(scope).partition("!")
        if base != SCOPE:
            continue
        if not where:
            return True
        kind, _, name = where.partition("=")
        if (
            (kind == "user" and name == user)
            or (kind == "server" and name == f"{user}/{server}")
            or (kind == "group" and name in groups)
        ):
            return True
    return False


class Gate:
    """Asks the hub who holds a token and whether its scopes reach this server's user."""

    def __init__(self, api_url: str, own_token: str, user: str, server: str) -> None:
        self.api_url = api_url.rstrip("/")
        self.own_token = own_token
        self.user = user
        self.server = server
        self._verdicts: dict[str, tuple[float, str | None]] = {}
        self._groups: tuple[float, set[str]] = (0.0, set())

    @classmethod
    def from_env(cls, env=os.environ) -> Gate | None:
        """The gate of a server a hub started; None anywhere else (no class API then)."""
        api, token, user = (
            env.get("JUPYTERHUB_API_URL"),
            env.get("JUPYTERHUB_API_TOKEN"),
            env.get("JUPYTERHUB_USER"),
        )
        if not (api and token and user):
            return None
        return cls(api, token, user, env.get("JUPYTERHUB_SERVER_NAME", ""))

    async def _whoami(self, token: str) -> dict | None:
        request = HTTPRequest(
            f"{self.api_url}/user", headers={"Authorization": f"token {token}"}, request_timeout=10
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as exc:
            if exc.code in (401, 403, 404):
                return None
            raise
        model = json.loads(response.body)
        return model if isinstance(model, dict) else None

    async def groups(self) -> set[str]:
        """This server's user's groups (the hub's word, kept :data:`KEEP_S` seconds)."""
        when, groups = self._groups
        if time.monotonic() - when < KEEP_S:
            return groups
        model = await self._whoami(self.own_token)
        groups = set(model.get("groups") or ()) if model else set()
        self._groups = (time.monotonic(), groups)
        return groups

    async def refusal(self, token: str | None) -> str | None:
        """Why ``token`` may not read this user's tfmagic, or None when it may."""
        if not token:
            return "send a hub token (Authorization: token ...) whose scopes include " + SCOPE
        now = time.monotonic()
        kept = self._verdicts.get(token)
        if kept is not None and now - kept[0] < KEEP_S:
            return kept[1]
        model = await self._whoami(token)
        if model is None:
            why: str | None = "the hub does not know this token"
        elif grants(model.get("scopes"), self.user, self.server, await self.groups()):
            why = None
        else:
            who = model.get("name") or "this token's owner"
            why = f"{who} holds no {SCOPE} scope for {self.user} (ask the hub's admin)"
        if len(self._verdicts) > 1000:
            self._verdicts.clear()
        self._verdicts[token] = (now, why)
        return why


class _ClassHandler(web.RequestHandler):
    """Token in, scope checked, JSON out; never Jupyter's login (a teacher has none on this server)."""

    async def prepare(self) -> None:
        header = self.request.headers.get("Authorization", "")
        kind, _, token = header.partition(" ")
        token = token.strip() if kind.lower() in ("token", "bearer") else ""
        why = await self.settings["tfmagic_gate"].refusal(token or None)
        if why is not None:
            raise web.HTTPError(403, why)

    @property
    def root(self):
        return self.settings["tfmagic_dir"]

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message}))


class ClassAPI(_ClassHandler):
    async def get(self) -> None:
        gate = self.settings["tfmagic_gate"]
        try:
            usage = quota.usage()
        except Exception as exc:  # noqa: BLE001 - a malformed limit: say it, do not hide the clusters
            usage = {"error": str(exc)}
        self.set_header("Cache-Control", "no-store")
        self.finish(
            json.dumps(
                {
                    "user": gate.user,
                    "clusters": records.read_all(self.root),
                    "experiments": records.results(self.root),
                    "usage": usage,
                    "limits_set_by": os.environ.get(quota.ENV_SET_BY, ""),
                }
            )
        )


class ClassFrame(_ClassHandler):
    async def get(self, rid: str, kind: str) -> None:
        serve_frame(self, self.root, rid, kind)


def handlers(base_url: str, join) -> list:
    """The class API's routes under the server's base URL."""
    return [
        (join(base_url, "tfmagic/api/class"), ClassAPI),
        (join(base_url, r"tfmagic/api/class/cluster/([^/]+)/frame\.(json|png)"), ClassFrame),
    ]
