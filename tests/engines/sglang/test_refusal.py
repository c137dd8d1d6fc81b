"""An SGLang server's 4xx to ``/generate`` is the request's own fault: RequestRefused (final,
never retried); a 5xx is a plain EngineError. Against a scripted HTTP server."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from pearl.core.errors import RequestRefused
from pearl.engines.base import EngineError
from pearl.engines.sglang import SGLangClient


class Scripted(http.server.BaseHTTPRequestHandler):
    status = 400
    posts = 0

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        type(self).posts += 1
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"error": {"message": "Token id 600 is out of vocabulary"}}).encode()
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.mark.parametrize("status, refused", [(400, True), (422, True), (500, False)])
def test_a_4xx_is_refused_and_a_5xx_is_not(server: str, status: int, refused: bool) -> None:
    Scripted.status, Scripted.posts = status, 0
    with pytest.raises(EngineError) as e:
        SGLangClient(server).generate({"input_ids": [600]})
    assert isinstance(e.value, RequestRefused) is refused
    assert "out of vocabulary" in str(e.value) and Scripted.posts == 1
