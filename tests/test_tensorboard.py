"""TensorBoard's port: the operating system picks it as TensorBoard binds (nobody can take it first), and
show() embeds only what TensorBoard's own process serves."""

from __future__ import annotations

import http.server
import os
import threading

import psutil
import pytest

from tfmagic import tensorboard

pytestmark = pytest.mark.server


class _Impostor(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"data_location": "not tensorboard"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_port_held_by_another_process_is_refused_and_tensorboard_ended(tmp_path, monkeypatch):
    """Should the port found ever be another process's (which answers 200 on /data/environment, as
    TensorBoard would), the page must not embed it."""
    impostor = http.server.HTTPServer(("127.0.0.1", 0), _Impostor)
    port = impostor.server_address[1]
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    monkeypatch.setattr(tensorboard, "_own_port", lambda pid: port)
    (tmp_path / "tb").mkdir()
    try:
        board = tensorboard.show(tmp_path / "tb", timeout=60)
        assert board.error.startswith(
            f"port {port} is held by process {os.getpid()}, not by the TensorBoard"
        ), board.error
        assert "\n" not in board.error and "iframe" not in board._repr_html_()
        assert (
            not board.alive
            and not psutil.pid_exists(board.pid)
            or psutil.Process(board.pid).status() == "zombie"
        )
        assert tensorboard._running.get((tmp_path / "tb").resolve()) is None, "not kept for reuse"
    finally:
        impostor.shutdown()
        impostor.server_close()


def test_tensorboards_own_listener_is_recognised(tmp_path):
    """The port is not named on TensorBoard's command line (a port chosen before the bind could be taken
    in between: it was, once, by the CI's own tasks); the one shown is the one its process holds."""
    (tmp_path / "tb").mkdir()
    board = tensorboard.show(tmp_path / "tb", timeout=90)
    try:
        assert not board.error, board.error
        assert "--port=0" in psutil.Process(board.pid).cmdline()
        assert tensorboard._listener_pid(board.port) in tensorboard._tree(board.pid)
    finally:
        board.kill()
    assert not board.alive
