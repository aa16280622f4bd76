"""A real JupyterHub for the tests: on loopback, private to the run, with its proxy and services.

``jupyterhub`` (PyPI) with ``configurable-http-proxy`` (npm; ``.ci/run`` installs both), the dummy
authenticator (one password for everyone, fit for tests) and single-user servers spawned as local
processes (``SimpleLocalProcessSpawner``, a home of their own each, and JupyterHub's own identity for
each: the scopes, the tokens and the hub's checks are the real ones).  Run as root, each user's server,
kernels and tasks run as a **Unix user of their own** (``tfmagic-test-<name>``, made for the hub and
removed with it), as The Littlest JupyterHub runs its users: :data:`AS_USER` drops to that user
after binding this Python's installation where other users can read it (it may live under
``/root``, mode 0700), as tests/test_loopback.py's ``as_another_user`` does.  Groups and
the tfmagic service come from the config text the test gives (``tfmagic.hub.configure``).  A test
admin service holds a token to start servers and make tokens; nothing a student or teacher does
goes through it.

Stopping ends the hub (which stops the servers it spawned and its proxy), then checks that nothing
it started lives: the servers, their kernels, their task processes, the proxy and the services.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from tfmagic.network.ports import free_port

from .conftest import assert_gone, poll_for, task_processes
from .jupyterutil import ServedProcess

PROXY = shutil.which("configurable-http-proxy")
#: the Unix user a hub user's server runs as (``Hub.as_users``)
UNIX_USER = "tfmagic-test-{name}"

#: The spawner's command when users are Unix users: run as root by the hub, it binds this Python's
#: installation (argv[1]) onto a folder every user can read (argv[2]) in a mount namespace of the
#: server's own and becomes the hub user's Unix user before it starts the single-user server there.
#: LD_LIBRARY_PATH: the interpreter's RUNPATH names the installation's own path, which the user
#: cannot enter; without it the loader finds the system's libpython, whose layout has no
#: site-packages.
AS_USER = textwrap.dedent(
    """\
    import os, pwd, shlex, sys
    prefix, mount, python = sys.argv[1:4]
    entry = pwd.getpwnam(UNIX_USER.format(name=os.environ["JUPYTERHUB_USER"]))
    os.environ["LD_LIBRARY_PATH"] = os.path.join(mount, "lib")
    os.environ["PATH"] = os.path.join(mount, "bin") + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
    os.environ["USER"] = os.environ["LOGNAME"] = entry.pw_name
    inner = " ".join([
        "mount --bind", shlex.quote(prefix), shlex.quote(mount), "&&",
        "exec setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups",
        shlex.quote(python), "-m jupyterhub.singleuser", *map(shlex.quote, sys.argv[4:]),
    ])
    os.execvp("unshare", ["unshare", "-m", "--propagation", "private", "sh", "-c", inner])
    """
)


def unix_users_here() -> str | None:
    """Why users' servers cannot run as Unix users of their own here, or None."""
    if os.geteuid() != 0:
        return "not root"
    missing = [c for c in ("unshare", "setpriv", "useradd", "userdel") if shutil.which(c) is None]
    return f"no {', '.join(missing)} (util-linux, passwd)" if missing else None


def available() -> str | None:
    """Why a hub cannot run here, or None."""
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        return "jupyterhub is not installed (pip install -e '.[test]')"
    if PROXY is None:
        return "configurable-http-proxy is not installed (.ci/run: npm install -g configurable-http-proxy)"
    return None


class Hub(ServedProcess):
    """A JupyterHub on 127.0.0.1; ``config`` is Python appended to its jupyterhub_config.py (``c`` in scope)."""

    what = "the hub"

    def __init__(
        self,
        tmp: Path,
        config: str,
        env: dict[str, str] | None = None,
        ready_s: float = 120,
        as_users: bool | None = None,
    ) -> None:
        """``as_users``: each user's server as a Unix user of their own (default: where
        :func:`unix_users_here` allows it)."""
        self.tmp = tmp
        self.port, self.hub_port, self.proxy_api = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.admin_token = secrets.token_hex(16)
        self.as_users = unix_users_here() is None if as_users is None else as_users
        self.made_users: list[str] = []
        # outside pytest's own folder (mode 0700): each user enters their home
        self.shared = Path(tempfile.mkdtemp(prefix="tfmagic-hub-"))
        self.shared.chmod(0o755)
        self.homes = self.shared / "home"
        self.homes.mkdir()
        keep = {"TFMAGIC_SPARES": "0", **(env or {})}
        installed = (
            Path(sysconfig.get_path("data")) / "etc" / "jupyter" / "jupyter_server_config.d" / "tfmagic.json"
        )
        if not installed.exists():
            # an editable install (pip install -e) installs no data files: the same file from the
            # repository, through the same config mechanism (as tests/test_server.py does)
            keep["JUPYTER_CONFIG_PATH"] = str(Path(__file__).resolve().parents[1] / "jupyter-config")
        if self.as_users:
            prefix = Path(sys.base_prefix).resolve()
            python = Path(sys.executable).resolve()
            mount = self.shared / "python"
            mount.mkdir(mode=0o755)
            wrapper = self.shared / "as_user.py"
            wrapper.write_text(f"UNIX_USER = {UNIX_USER!r}\n" + AS_USER)
            cmd = [
                sys.executable,
                str(wrapper),
                str(prefix),
                str(mount),
                str(mount / python.relative_to(prefix)),
            ]
            args = []
        else:
            cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
            args = ["--allow-root"] if os.geteuid() == 0 else []
        cfg = tmp / "jupyterhub_config.py"
        cfg.write_text(
            textwrap.dedent(
                f"""\
                import sys
                c = get_config()  # noqa
                c.JupyterHub.bind_url = {self.url!r}
                c.JupyterHub.hub_bind_url = "http://127.0.0.1:{self.hub_port}"
                c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.proxy_api}"
                c.ConfigurableHTTPProxy.command = [{PROXY!r}]
                c.ConfigurableHTTPProxy.pid_file = {str(tmp / "proxy.pid")!r}
                c.JupyterHub.pid_file = {str(tmp / "hub.pid")!r}
                c.JupyterHub.db_url = "sqlite:///{tmp / "hub.sqlite"}"
                c.JupyterHub.cookie_secret_file = {str(tmp / "cookie_secret")!r}
                c.JupyterHub.authenticator_class = "dummy"
                c.DummyAuthenticator.password = "class-password"
                c.Authenticator.allow_all = True
                c.JupyterHub.spawner_class = "simple"
                c.SimpleLocalProcessSpawner.home_dir_template = {str(self.homes / "{username}")!r}
                c.Spawner.cmd = {cmd!r}
                c.Spawner.args = {args!r}
                c.Spawner.http_timeout = 120
                c.Spawner.start_timeout = 180
                c.Spawner.environment = {keep!r}
                c.Spawner.environment["JUPYTER_RUNTIME_DIR"] = lambda spawner: {str(self.homes)!r} + "/" + spawner.user.name + "/runtime"
                c.JupyterHub.services = [{{"name": "test-admin", "api_token": {self.admin_token!r}}}]
                c.JupyterHub.load_roles = [{{
                    "name": "test-admin", "services": ["test-admin"],
                    "scopes": ["admin:users", "admin:servers", "access:servers", "tokens", "admin:groups"],
                }}]
                """
            )
            + textwrap.dedent(config)
        )
        environment = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
        self._launch(
            [sys.executable, "-m", "jupyterhub", "-f", str(cfg)],
            tmp / "hub.log",
            environment,
            ready_s,
            interval=0.3,
            cwd=tmp,
        )

    def _answers(self) -> bool:
        return self.call("GET", "hub/api/")[0] == 200

    def call(self, method: str, path: str, body=None, token: str | None = None) -> tuple[int, object]:
        """One request through the hub's proxy with ``token`` (the admin's by default): (status, JSON or bytes)."""
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"token {token or self.admin_token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw

    def unix_user(self, name: str) -> str:
        """The Unix user ``name``'s server runs as, made (with its home) if it does not exist."""
        user = UNIX_USER.format(name=name)
        home = self.homes / name
        home.mkdir(exist_ok=True)
        if self.as_users:
            if subprocess.run(["id", "-u", user], capture_output=True).returncode != 0:
                made = subprocess.run(
                    [
                        "useradd",
                        "--system",
                        "--user-group",
                        "--no-create-home",
                        "--home-dir",
                        str(home),
                        "--shell",
                        "/usr/sbin/nologin",
                        user,
                    ],
                    capture_output=True,
                    text=True,
                )
                assert made.returncode == 0, made.stderr
                self.made_users.append(user)
            (home / "runtime").mkdir(exist_ok=True)
            subprocess.run(["chown", "-R", f"{user}:{user}", str(home)], check=True)
            home.chmod(0o700)
        return user if self.as_users else psutil.Process().username()

    def start_server(self, name: str, timeout: float = 180) -> UserServer:
        """Spawn ``name``'s single-user server (as the hub's spawn button does) and wait until it is ready."""
        self.unix_user(name)
        status, body = self.call("POST", f"hub/api/users/{name}/server")
        assert status in (201, 202, 400), (status, body)  # 400: already running

        def ready():
            model = self.call("GET", f"hub/api/users/{name}")[1]
            server = (model.get("servers") or {}).get("")
            return server if server and server.get("ready") else None

        poll_for(ready, timeout, interval=0.5, what=lambda: f"{name}'s server: " + self.log_tail())
        return UserServer(self, name)

    def token(self, name: str) -> str:
        """A new API token of ``name``'s, with all their permissions (as the hub's token page makes)."""
        status, body = self.call("POST", f"hub/api/users/{name}/tokens", {"note": "tfmagic test"})
        assert status == 201, (status, body)
        return body["token"]

    def stop(self, check: bool = True, gone_s: float = 60) -> None:
        """SIGTERM the hub (it stops the servers it spawned, its proxy and its services), then check."""
        spawned = (
            [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
            if self.proc.poll() is None
            else []
        )
        proxy = None
        try:
            proxy = int((self.tmp / "proxy.pid").read_text())
        except (OSError, ValueError):
            pass
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        except Exception:  # noqa: BLE001 - a hub that would not stop: by its pid
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
        try:
            if check:
                assert_gone(
                    set(spawned) | ({proxy} if proxy else set()) | (set(task_processes()) - self.before),
                    gone_s,
                )
        finally:
            for user in self.made_users:
                subprocess.run(["userdel", user], capture_output=True)
            shutil.rmtree(self.shared, ignore_errors=True)


class UserServer:
    """A user's single-user server as tests/jupyterutil.Kernel drives it (REST API with the admin's token)."""

    def __init__(self, hub: Hub, name: str) -> None:
        self.hub, self.name = hub, name
        self.base = f"user/{name}/"
        self.runtime = hub.homes / name / "runtime"

    def api(self, method: str, path: str, body=None):
        status, data = self.hub.call(method, self.base + path, body)
        assert status < 400, (status, data)
        return data
