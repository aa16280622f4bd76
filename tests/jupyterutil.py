"""The tests' one Jupyter server launcher: a real server (``jupyter server`` or ``jupyter lab``) on a
free loopback port with a token, private config, data and runtime directories, and its log kept.

Used by the server tests (the extension, TensorBoard behind the proxy) and the browser tests (the
dashboard in JupyterLab, Notebook 7 and Voila).  Stopping it goes through the server's own shutdown
API (which ends its kernels, as closing Jupyter does), then its pid; a teardown checks that no task
process started meanwhile outlives it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tfmagic.network.ports import free_port

from .conftest import assert_gone, poll_for, task_processes


class ServedProcess:
    """A server the tests start in a session of its own, its output in a log, ready once it answers.

    Subclasses say what answering is (:meth:`_answers`) and how to stop (``stop``); the start, the
    readiness poll (a server that ends while starting fails at once, with its log) and the log's
    tail are here, for the Jupyter server and the hub (tests/hubhost.py) alike.
    """

    what = "the server"

    def _launch(
        self, argv: list[str], log_path: Path, env: dict, ready_s: float, interval: float, cwd=None
    ) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.before = set(task_processes())
        try:
            # a minute and more when the other test lane loads the machine
            poll_for(self._ready, ready_s, interval=interval, what=lambda: f"{self.what}: " + self.log_tail())
        except BaseException:
            self.stop(check=False)
            raise

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.what} ended: " + self.log_tail())
        try:
            return self._answers()
        except OSError:
            return False

    def _answers(self) -> bool:
        raise NotImplementedError

    def stop(self, check: bool = True) -> None:
        raise NotImplementedError


class JupyterServer(ServedProcess):
    """``app`` is "server" or "lab"; ``base_url`` as a hub would give it; ``env`` is added to this
    process's environment (with spares off, and pytest's marker removed so kernels forward output)."""

    what = "the Jupyter server"

    def __init__(
        self,
        tmp: Path,
        app: str = "server",
        base_url: str = "/",
        env: dict[str, str] | None = None,
        drop_env: tuple[str, ...] = (),
        ready_s: float = 180,
    ) -> None:
        self.tmp = tmp
        self.work = tmp / "work"
        self.work.mkdir(exist_ok=True)
        environment = dict(os.environ, TFMAGIC_SPARES="0")
        for name in ("PYTEST_CURRENT_TEST", *drop_env):
            environment.pop(name, None)
        for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
            d = tmp / name.lower()
            d.mkdir(mode=0o700, exist_ok=True)
            environment[name] = str(d)
        environment.update(env or {})
        self.runtime = Path(environment["JUPYTER_RUNTIME_DIR"])
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}{base_url}"
        self._launch(
            [
                sys.executable,
                "-m",
                "jupyter",
                app,
                "--allow-root",
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--port={self.port}",
                "--port-retries=0",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.base_url={base_url}",
                f"--ServerApp.root_dir={self.work}",
            ],
            tmp / "server.log",
            environment,
            ready_s,
            interval=0.05,
        )

    def _answers(self) -> bool:
        with urllib.request.urlopen(f"{self.url}api/status?token={self.token}", timeout=2) as r:
            return r.status == 200

    def api(self, method: str, path: str, body: dict | None = None) -> dict | None:
        """One call of the server's REST API (``path`` below the base URL)."""
        req = urllib.request.Request(
            f"{self.url}{path}?token={self.token}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read()
        return json.loads(text) if text else None

    def stop(self, check: bool = True, gone_s: float = 30) -> None:
        """The server's shutdown (its kernels end with it), then its pid; nothing it started may live."""
        try:
            self.api("POST", "api/shutdown")
            self.proc.wait(30)
        except Exception:  # noqa: BLE001 - the server did not shut down: end it by its pid
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
        if check:
            assert_gone(set(task_processes()) - self.before, timeout=gone_s)


class Kernel:
    """The notebook's kernel, started by the server (as a notebook page does), driven by jupyter_client.

    ``server`` is anything with ``api(method, path, body)`` (the server's REST API) and ``runtime``
    (its runtime directory, where the kernel's connection file is written): a :class:`JupyterServer`,
    or a hub's single-user server (tests/hubhost.py)."""

    def __init__(self, server, notebook: str = "class.ipynb") -> None:
        from jupyter_client import BlockingKernelClient

        self.server = server
        session = server.api(
            "POST", "api/sessions", {"path": notebook, "type": "notebook", "kernel": {"name": "python3"}}
        )
        self.session_id, self.id = session["id"], session["kernel"]["id"]
        connection = server.runtime / f"kernel-{self.id}.json"
        poll_for(connection.exists, 30, what="the kernel's connection file")
        self.client = BlockingKernelClient(connection_file=str(connection))
        self.client.load_connection_file()
        self.client.start_channels(hb=False)  # a heartbeat that has not beaten yet reads as a dead kernel
        self.client.wait_for_ready(60)
        self.pid = self.run("import os; print(os.getpid())").strip().splitlines()[-1]

    def run(self, code: str, timeout: float = 180) -> str:
        """Run a cell; returns what it printed and displayed (text, and HTML after a marker)."""
        return self.wait(self.client.execute(code), timeout, code)

    def wait(self, msg_id: str, timeout: float = 180, code: str = "") -> str:
        """What the cell ``msg_id`` (from ``client.execute``) printed, once it has finished."""
        out, error = [], None
        deadline = time.monotonic() + timeout
        while True:
            msg = self.client.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind in ("execute_result", "display_data", "update_display_data"):
                data = content["data"]
                out.append(data.get("text/plain", ""))
                if "text/html" in data:
                    out.append("\nHTML:" + data["text/html"])
            elif kind == "error":
                error = "\n".join(content["traceback"])
            elif kind == "status" and content["execution_state"] == "idle":
                break
        if error:
            raise AssertionError(f"the cell failed:\n{code}\n{error}")
        return "".join(out)

    def close(self) -> None:
        self.client.stop_channels()
        self.server.api("DELETE", f"api/sessions/{self.session_id}")  # ends the kernel
