"""TensorBoard's port, taken first by someone else: show() says so instead of embedding their page."""

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


def test_a_port_taken_by_another_process_is_refused_and_tensorboard_ended(tmp_path, monkeypatch):
    """Another process binds the chosen port before TensorBoard can (seconds of import later) and answers
    200 on /data/environment, as TensorBoard would; the page must not embed it."""
    impostor = http.server.HTTPServer(("127.0.0.1", 0), _Impostor)
    port = impostor.server_address[1]
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    monkeypatch.setattr(tensorboard, "free_port", lambda: port)
    (tmp_path / "tb").mkdir()
    try:
        board = tensorboard.show(tmp_path / "tb", timeout=60)
        assert board.error.startswith(
            f"port {port} was taken by process {os.getpid()}, not by the TensorBoard"
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
    (tmp_path / "tb").mkdir()
    board = tensorboard.show(tmp_path / "tb", timeout=90)
    try:
        assert not board.error, board.error
        assert tensorboard._listener_pid(board.port) in tensorboard._tree(board.pid)
    finally:
        board.kill()
    assert not board.alive
