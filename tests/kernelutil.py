"""Drive a real IPython kernel (jupyter_client) the way a notebook does."""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field

from jupyter_client.manager import KernelManager


@dataclass
class Reply:
    status: str
    streams: str = ""
    stdout: str = ""
    stderr: str = ""
    displays: list[dict] = field(default_factory=list)
    error: dict | None = None
    result: dict | None = None

    @property
    def text(self) -> str:
        """Everything a person would read, as text."""
        parts = [self.streams]
        for d in self.displays + ([self.result] if self.result else []):
            parts.append(d.get("text/plain", ""))
        if self.error:
            parts.append("\n".join(self.error.get("traceback", [])))
        return "\n".join(parts)

    @property
    def html(self) -> str:
        return "\n".join(d.get("text/html", "") for d in self.displays + ([self.result] if self.result else []))


class Kernel:
    """A real ipykernel in its own process, with helpers to run cells."""

    def __init__(self, env: dict[str, str] | None = None):
        self.km = KernelManager(kernel_name="python3")
        kenv = dict(os.environ)
        kenv.update(env or {})
        self.km.start_kernel(env=kenv)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.km.provisioner.pid

    def run(self, code: str, timeout: float = 120.0, interrupt_after: float | None = None) -> Reply:
        msg_id = self.kc.execute(code)
        reply = Reply(status="?")
        deadline = time.monotonic() + timeout
        interrupt_at = None if interrupt_after is None else time.monotonic() + interrupt_after
        idle = False
        while not idle:
            if interrupt_at is not None and time.monotonic() > interrupt_at:
                self.km.interrupt_kernel()
                interrupt_at = None
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell did not finish in {timeout} s: {code[:200]!r}\nso far: {reply.text[-2000:]}")
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                reply.streams += content["text"]
                if content["name"] == "stdout":
                    reply.stdout += content["text"]
                else:
                    reply.stderr += content["text"]
            elif kind in ("display_data", "update_display_data"):
                reply.displays.append(content["data"])
            elif kind == "execute_result":
                reply.result = content["data"]
            elif kind == "error":
                reply.error = content
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
        shell = self.kc.get_shell_msg(timeout=30)
        while shell["parent_header"].get("msg_id") != msg_id:
            shell = self.kc.get_shell_msg(timeout=30)
        reply.status = shell["content"]["status"]
        return reply

    def ok(self, code: str, timeout: float = 120.0) -> Reply:
        reply = self.run(code, timeout)
        assert reply.status == "ok", reply.text[-3000:]
        return reply

    def value(self, expr: str):
        """Evaluate ``expr`` in the kernel and return it (via repr/literal_eval)."""
        import ast

        reply = self.ok(f"print(repr({expr}))")
        return ast.literal_eval(reply.stdout.strip().splitlines()[-1])

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=False)
