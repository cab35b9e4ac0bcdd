"""`relay dashboard PATH`: the learner metrics dashboard for a run directory or a folder of runs.

A standard-library HTTP server (no framework, no CDN: the charting library, uPlot, is vendored in
services/dashboard_static/). The page polls two JSON endpoints and appends new points to its
charts without reloading:

    GET /api/runs                          the runs under PATH (a run directory is one run)
    GET /api/metrics?run=NAME&since=K      complete metrics.jsonl lines from line K on

A missing run, an empty or torn metrics file, or a run directory that disappears gets a clear
JSON message, never a crash; a run name that resolves outside PATH is refused (403).
"""

from __future__ import annotations

import json
import os
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from contracts.metrics import CHARTS

STATIC = Path(__file__).with_name("static")
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html; charset=utf-8"}


class DashboardError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def is_run(path: Path) -> bool:
    return (path / "metrics.jsonl").is_file() or (path / "config.yaml").is_file()


class RunStore:
    """Reads runs under a root folder; every path it opens is checked to stay inside the root."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        # run -> (inode, line number, byte offset) where the last poll's complete lines ended, so
        # a poll for new lines reads only the file's tail instead of all of it again.
        self._ends: dict[str, tuple[int, int, int]] = {}

    def runs(self) -> list[str]:
        if not self.root.is_dir():
            raise DashboardError(HTTPStatus.NOT_FOUND, f"{self.root} does not exist (any more)")
        if is_run(self.root):
            return ["."]
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and is_run(p))

    def run_dir(self, name: str) -> Path:
        path = (self.root / name).resolve()
        if path != self.root and self.root not in path.parents:
            raise DashboardError(HTTPStatus.FORBIDDEN, f"run {name!r} is outside the served folder")
        if not path.is_dir():
            raise DashboardError(
                HTTPStatus.NOT_FOUND, f"run {name!r} not found (or its directory was removed)"
            )
        return path

    def metrics(self, name: str, since: int) -> dict[str, Any]:
        """Complete lines from `since` on; a torn last line (a write in progress) waits for later."""
        path = self.run_dir(name) / "metrics.jsonl"
        try:
            with path.open("rb") as f:
                st = os.fstat(f.fileno())
                first_line, offset = self._start(name, st, since)
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return {"run": name, "next": since, "lines": [], "note": "no metrics yet"}
        end = data.rfind(b"\n") + 1
        complete = data[:end].splitlines()
        lines = []
        for raw in complete[since - first_line :]:
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError:
                lines.append(None)  # keeps line numbering; the page skips it
        self._ends[name] = (st.st_ino, first_line + len(complete), offset + end)
        return {"run": name, "next": first_line + len(complete), "lines": lines}

    def _start(self, name: str, st: os.stat_result, since: int) -> tuple[int, int]:
        """(line number, byte offset) to read from: where the last poll ended when that is still
        the same file and not past `since`, else the start (a resume replaces the file)."""
        ino, line_no, offset = self._ends.get(name, (-1, 0, 0))
        if ino == st.st_ino and line_no <= since and offset <= st.st_size:
            return line_no, offset
        return 0, 0


class Handler(BaseHTTPRequestHandler):
    """Routes GET requests; `store` is set per server by `make_handler`."""

    store: RunStore

    def log_message(self, format: str, *args: Any) -> None:  # quiet: no line per poll
        pass

    def _send(self, status: HTTPStatus, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: HTTPStatus, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _static(self, name: str) -> None:
        path = (STATIC / name).resolve()
        if path.parent != STATIC.resolve() or not path.is_file():
            raise DashboardError(HTTPStatus.NOT_FOUND, f"no file {name!r}")
        self._send(
            HTTPStatus.OK, path.read_bytes(), STATIC_TYPES.get(path.suffix, "application/octet-stream")
        )

    def _route(self, path: str, query: dict[str, str]) -> None:
        if path in ("/", "/index.html"):
            self._static("index.html")
        elif path.startswith("/static/"):
            self._static(path.removeprefix("/static/"))
        elif path == "/api/charts":
            self._json(HTTPStatus.OK, {"charts": CHARTS})
        elif path == "/api/runs":
            self._json(HTTPStatus.OK, {"root": str(self.store.root), "runs": self.store.runs()})
        elif path == "/api/metrics":
            since = max(int(query.get("since", "0")), 0)
            self._json(HTTPStatus.OK, self.store.metrics(query.get("run", "."), since))
        else:
            raise DashboardError(HTTPStatus.NOT_FOUND, f"no page {path}")

    def do_GET(self) -> None:
        url = urlparse(self.path)
        try:
            self._route(url.path, {k: v[0] for k, v in parse_qs(url.query).items()})
        except DashboardError as err:
            self._json(err.status, {"error": str(err)})
        except ValueError:
            self._json(HTTPStatus.BAD_REQUEST, {"error": "since must be a whole number"})


def make_handler(store: RunStore) -> type[BaseHTTPRequestHandler]:
    return type("BoundHandler", (Handler,), {"store": store})


class Dashboard:
    """The server on a background thread (for `relay train --dashboard` and tests) or in front."""

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.store = RunStore(root)
        self.server = ThreadingHTTPServer((host, port), make_handler(self.store))
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/"

    def start(self) -> Dashboard:
        self._thread = threading.Thread(target=self.server.serve_forever, name="relay-dashboard", daemon=True)
        self._thread.start()
        return self

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C in the foreground)."""
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
