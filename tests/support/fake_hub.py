"""A Hugging Face Hub stand-in on 127.0.0.1: just the `resolve` URLs that hf_hub_download uses.

HEAD answers with the commit, ETag and size headers the client expects; GET serves the bytes and honours
`Range: bytes=N-`. `drop_after` makes the first GET of a file close the connection after that many bytes,
as a flaky network would; `corrupt` serves zeros of the right length under the true ETag. Every request is recorded so tests can see what the client asked for.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeHub:
    files: dict[tuple[str, str], bytes] = field(default_factory=dict)
    drop_after: int | None = None
    corrupt: bool = False
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""

    def add(self, repo: str, filename: str, content: bytes) -> None:
        self.files[(repo, filename)] = content

    def gets(self, filename: str) -> list[str | None]:
        """The Range header of every GET of `filename` (None for a plain GET)."""
        return [rng for method, path, rng in self.requests if method == "GET" and path.endswith("/" + filename)]


def serve(hub: FakeHub) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args: object) -> None:
            pass

        def _lookup(self) -> bytes | None:
            parts = self.path.split("?")[0].strip("/").split("/")
            if len(parts) < 5 or parts[2] != "resolve":
                return None
            return hub.files.get(("/".join(parts[:2]), "/".join(parts[4:])))

        def _headers(self, content: bytes, status: int, length: int, extra: dict[str, str]) -> None:
            self.send_response(status)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{hashlib.sha256(content).hexdigest()}"')
            self.send_header("Content-Length", str(length))
            self.send_header("Accept-Ranges", "bytes")
            for key, value in extra.items():
                self.send_header(key, value)
            self.end_headers()

        def _not_found(self) -> None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("X-Error-Message", "Entry not found")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_HEAD(self) -> None:
            hub.requests.append(("HEAD", self.path, None))
            content = self._lookup()
            if content is None:
                return self._not_found()
            self._headers(content, 200, len(content), {})

        def do_GET(self) -> None:
            requested = self.headers.get("Range")
            hub.requests.append(("GET", self.path, requested))
            content = self._lookup()
            if content is None:
                return self._not_found()
            start = int(requested.split("=")[1].split("-")[0]) if requested else 0
            body = content[start:]
            if requested:
                self._headers(content, 206, len(body),
                              {"Content-Range": f"bytes {start}-{len(content) - 1}/{len(content)}"})
            else:
                self._headers(content, 200, len(body), {})
            if hub.corrupt:
                body = bytes(len(body))
            if hub.drop_after is not None and start == 0:
                hub.drop_after, cut = None, hub.drop_after
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    # Polled every 20 ms for a shutdown: the default half second was most of each hub test's teardown.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return server
