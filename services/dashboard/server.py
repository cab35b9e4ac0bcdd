"""`relay dashboard PATH`: the learner metrics dashboard for a run directory or a folder of runs.

A standard-library HTTP server (no framework, no CDN: the charting library, uPlot, is vendored in
services/dashboard/static/). The page polls two JSON endpoints and appends new points to its
charts without reloading:

    GET /api/runs                          the runs under PATH (a run directory is one run)
    GET /api/charts[?run=NAME]             the charts to draw: the run's family's, and its x axis
    GET /api/metrics?run=NAME&since=K      complete metrics.jsonl lines from line K on
    GET /api/videos?run=NAME               the run's evaluation videos, oldest first
    GET /api/sweep                         a sweep folder's trials: values, status, PBT exploits
    GET /api/samples?run=NAME              a language run's newest samples (prompt, completion, reward)
    GET /video?run=NAME&name=FILE          one of them (video/mp4, with HTTP range requests)

A missing run, an empty or torn metrics file, or a run directory that disappears gets a clear
JSON message, never a crash. It keeps serving whatever is in the folder:

- responses are strict JSON: a line that is not valid UTF-8 or not a JSON object is sent as null
  (the page skips it; the lines after it are served), and non-finite numbers (NaN, Infinity,
  1e999) as null;
- only regular files are read (a FIFO or a directory named metrics.jsonl gets an error, never a
  hung thread), a line over MAX_LINE_BYTES is skipped, and one response carries at most
  MAX_RESPONSE_BYTES of lines (the page asks again for the rest);
- no path leaves the served folder, symbolic links included (403); a video is a file of the run's
  videos/ folder named as relay names them, served in ranges (browsers seek with them);
- on a loopback address only requests whose Host header names that address are answered (a DNS
  rebinding page cannot read the metrics through the victim's browser).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from ...contracts.config import MAX_CONFIG_BYTES, ConfigError, family_of_kind, load_config, parse_yaml
from ...services.driver.families import FAMILIES
from ...services.runs.files import read_regular
from ...services.runs.metric_keys import catalog
from ...services.runs.sweep_records import SWEEP_FILE, TRIALS_FILE, TrialLog, read_exploits

STATIC = Path(__file__).with_name("static")
MAX_LINE_BYTES = 1 << 20  # relay writes lines of a few KB
MAX_RESPONSE_BYTES = 4 << 20
SAMPLES_SHOWN = 12  # a language run's newest samples on the page
SAMPLES_TAIL_BYTES = 256 << 10  # 12 lines of at most ~4 KB each (run_dir.SAMPLE_CHARS), with room
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]", "::1")
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html; charset=utf-8"}
# What relay writes into RUN/videos (services/driver/evaluations.py): iteration, return, and a
# number when the name was taken.
VIDEO_NAME = re.compile(r"^iter-(\d{1,12})-return-(m?)(\d{1,15})(?:-\d{1,4})?\.mp4$")
VIDEO_CHUNK = 1 << 20  # a video is sent in pieces this large, never read whole


class ApiError(Exception):
    """A request the dashboard answers with an HTTP error (`status`, and `message` as JSON); not
    the driver's DashboardError, which is a dashboard that cannot start (exit 2)."""

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
            raise ApiError(HTTPStatus.NOT_FOUND, f"{self.root} does not exist (any more)")
        if is_run(self.root):
            return ["."]
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and is_run(p))

    def family(self, name: str) -> str:
        """The family of a run, by its config.yaml's model kind (read as data: a regular file,
        bounded, YAML's safe loader); a run without a readable one is drawn as an env run."""
        try:
            raw = read_regular(self.run_dir(name) / "config.yaml", MAX_CONFIG_BYTES)
            data = parse_yaml(raw.decode("utf-8"), "config.yaml")
            model = data.get("model") if isinstance(data, dict) else None
            return family_of_kind(model.get("kind") if isinstance(model, dict) else None)
        except (ApiError, OSError, UnicodeDecodeError, ConfigError):
            return family_of_kind(None)

    def charts(self, run: str | None) -> dict[str, Any]:
        """The charts the page draws: for a run, its family's panels in their order and its x
        axis; without one, every chart of the catalog against env steps."""
        charts = catalog().charts
        entry = FAMILIES[self.family(run)] if run is not None else None
        if entry is None or entry.panels is None:
            x_key, x_label = entry.x_axis if entry is not None else ("env_steps", "env steps")
            return {"charts": charts, "x": {"key": x_key, "label": x_label}}
        by_id = {c["id"]: c for c in charts}
        chosen = [by_id[i] for i in entry.panels if i in by_id]
        return {"charts": chosen, "x": {"key": entry.x_axis[0], "label": entry.x_axis[1]}}

    def run_dir(self, name: str) -> Path:
        path = (self.root / name).resolve()
        if path != self.root and self.root not in path.parents:
            raise ApiError(HTTPStatus.FORBIDDEN, f"run {name!r} is outside the served folder")
        if not path.is_dir():
            raise ApiError(HTTPStatus.NOT_FOUND, f"run {name!r} not found (or its directory was removed)")
        return path

    def _open_metrics(self, name: str) -> tuple[int, os.stat_result]:
        """An open descriptor of the run's metrics.jsonl and its stat; the file must be a regular
        file inside the served folder (a symbolic link is followed only when its target is)."""
        path = self.run_dir(name) / "metrics.jsonl"
        real = path.resolve()
        if real != self.root and self.root not in real.parents:
            raise ApiError(HTTPStatus.FORBIDDEN, f"metrics of run {name!r} point outside the served folder")
        # O_NONBLOCK: opening a FIFO for reading must not wait for a writer.
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ApiError(HTTPStatus.CONFLICT, f"metrics.jsonl of run {name!r} is not a regular file")
        return fd, st

    def sweep(self) -> dict[str, Any]:
        """When the folder is a `relay sweep`'s: the ranked metric, the swept keys, and each trial's
        values, status and PBT exploits (records read as data); {"sweep": None} otherwise."""
        if not (self.root / SWEEP_FILE).is_file() or not (self.root / TRIALS_FILE).is_file():
            return {"sweep": None}
        try:
            options = load_config(self.root / SWEEP_FILE).sweep
        except ConfigError as err:
            raise ApiError(HTTPStatus.CONFLICT, f"{SWEEP_FILE}: {err}") from None
        trials = {}
        log = TrialLog(self.root)
        for name, state in sorted(log.read().items()):
            run = self.root / name
            if not run.is_dir() or run.is_symlink():
                continue
            ended = state.get("event") == "ended"
            status = state.get("status") if ended else "running or interrupted"
            trials[name] = {
                "params": state.get("params", {}),
                "status": status,
                "exploits": read_exploits(run),
            }
        keys = sorted({k for t in trials.values() for k in t["params"]})
        return {
            "sweep": {
                "metric": options.metric,
                "mode": options.mode,
                "params": keys,
                "trials": trials,
                "skipped_lines": log.skipped,
            }
        }

    def videos(self, name: str) -> dict[str, Any]:
        """The run's videos, by iteration: name, iteration, return, bytes."""
        folder = self.run_dir(name) / "videos"
        found = []
        if folder.is_dir() and not folder.is_symlink():
            for path in folder.iterdir():
                m = VIDEO_NAME.match(path.name)
                if m and path.is_file() and not path.is_symlink():
                    ret = int(m.group(3)) * (-1 if m.group(2) else 1)
                    found.append(
                        {
                            "name": path.name,
                            "iteration": int(m.group(1)),
                            "return": ret,
                            "bytes": path.stat().st_size,
                        }
                    )
        found.sort(key=lambda v: (v["iteration"], v["name"]))
        return {"run": name, "videos": found}

    def samples(self, name: str) -> dict[str, Any]:
        """The newest SAMPLES_SHOWN lines of the run's samples.jsonl (read from its tail, at most
        SAMPLES_TAIL_BYTES: the file only grows), newest first."""
        path = self.run_dir(name) / "samples.jsonl"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except (FileNotFoundError, OSError):
            return {"run": name, "samples": []}
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return {"run": name, "samples": []}
            f.seek(max(0, st.st_size - SAMPLES_TAIL_BYTES))
            raw = f.read(SAMPLES_TAIL_BYTES)
        lines = raw.split(b"\n")[1 if st.st_size > SAMPLES_TAIL_BYTES else 0 : -1]  # whole lines only
        parsed = [p for p in (parse_line(x) for x in lines[-SAMPLES_SHOWN:]) if p is not None]
        return {"run": name, "samples": parsed[::-1]}

    def open_video(self, name: str, video: str) -> tuple[int, int]:
        """(descriptor, size) of a video of the run: a regular file in its videos/ folder, named as
        relay names them, no link anywhere on the way."""
        if not VIDEO_NAME.match(video):
            raise ApiError(HTTPStatus.NOT_FOUND, f"no video {video!r}")
        folder = self.run_dir(name) / "videos"
        path = folder / video
        if folder.is_symlink() or path.is_symlink():
            raise ApiError(HTTPStatus.FORBIDDEN, f"video {video!r} is behind a link")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise ApiError(HTTPStatus.NOT_FOUND, f"no video {video!r} in run {name!r}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ApiError(HTTPStatus.CONFLICT, f"video {video!r} is not a regular file")
        return fd, st.st_size

    def metrics(self, name: str, since: int) -> dict[str, Any]:
        """Complete lines from `since` on, at most MAX_RESPONSE_BYTES of them; a torn last line (a
        write in progress) waits for later."""
        try:
            fd, st = self._open_metrics(name)
        except FileNotFoundError:
            return {"run": name, "next": since, "lines": [], "note": "no metrics yet"}
        with os.fdopen(fd, "rb") as f:
            line_no, pos = self._start(name, st, since)
            f.seek(pos)
            lines: list[dict[str, Any] | None] = []
            envelope = {"run": name, "next": 1 << 40, "lines": []}  # the most `next` can be
            budget = MAX_RESPONSE_BYTES - len(json.dumps(envelope, separators=(",", ":")))
            while budget > 0:
                raw = f.readline(MAX_LINE_BYTES + 1)
                size = len(raw)
                if not raw.endswith(b"\n"):
                    rest = _rest_of_line(f) if size > MAX_LINE_BYTES else None
                    if rest is None:
                        break  # the end, or a line still being written
                    size, raw = size + rest, b""  # an over-long line: skipped
                    f.seek(pos + size)
                if line_no >= since:
                    parsed = parse_line(raw) if raw else None
                    # The cap holds for the body as sent: a line costs what it costs re-encoded
                    # (escapes can make it several times its size on disk).
                    cost = len(json.dumps(parsed, separators=(",", ":"), allow_nan=False)) + 1
                    if cost > budget and lines:
                        break  # the page asks again from `next`
                    lines.append(parsed)
                    budget -= cost
                pos, line_no = pos + size, line_no + 1
        self._ends[name] = (st.st_ino, line_no, pos)
        return {"run": name, "next": line_no, "lines": lines}

    def _start(self, name: str, st: os.stat_result, since: int) -> tuple[int, int]:
        """(line number, byte offset) to read from: where the last poll ended when that is still
        the same file and not past `since`, else the start (a resume replaces the file)."""
        ino, line_no, offset = self._ends.get(name, (-1, 0, 0))
        if ino == st.st_ino and line_no <= since and offset <= st.st_size:
            return line_no, offset
        return 0, 0


def _rest_of_line(f: Any, chunk: int = 1 << 16) -> int | None:
    """Bytes up to and including the next newline from f's position, or None when the line is not
    complete yet (f is moved; the caller seeks)."""
    size = 0
    while True:
        data = f.read(chunk)
        if not data:
            return None
        cut = data.find(b"\n")
        if cut >= 0:
            return size + cut + 1
        size += len(data)


def _finite(value: Any) -> Any:
    """JSON values with non-finite floats as None (JSON has no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def parse_line(raw: bytes) -> dict[str, Any] | None:
    """A metrics line as a JSON object with finite numbers, or None when it is not one."""
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=lambda _: None)
        return _finite(obj) if isinstance(obj, dict) else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


class Handler(BaseHTTPRequestHandler):
    """Routes GET requests; `store` is set per server by `make_handler`."""

    store: RunStore
    allowed_hosts: frozenset[str] | None = None  # None: any (the server is not on loopback)

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
        body = json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
        self._send(status, body, "application/json")

    def _host_allowed(self) -> bool:
        given = (self.headers.get("Host") or "").strip().lower()
        return self.allowed_hosts is None or given in self.allowed_hosts

    def _static(self, name: str) -> None:
        path = (STATIC / name).resolve()
        if path.parent != STATIC.resolve() or not path.is_file():
            raise ApiError(HTTPStatus.NOT_FOUND, f"no file {name!r}")
        self._send(
            HTTPStatus.OK, path.read_bytes(), STATIC_TYPES.get(path.suffix, "application/octet-stream")
        )

    def _video(self, run: str, name: str) -> None:
        """The file, whole (200) or the byte range the browser asks for (206; 416 past the end)."""
        fd, size = self.store.open_video(run, name)
        with os.fdopen(fd, "rb") as f:
            try:
                span = byte_range(self.headers.get("Range"), size)
            except Unsatisfiable:
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start, end = (0, size - 1) if span is None else span
            length = max(end - start + 1, 0)
            self.send_response(HTTPStatus.OK if span is None else HTTPStatus.PARTIAL_CONTENT)
            self.send_header("Content-Type", "video/mp4")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(length))
            if span is not None:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            f.seek(start)
            while length > 0 and (chunk := f.read(min(length, VIDEO_CHUNK))):  # streamed, never whole
                self.wfile.write(chunk)
                length -= len(chunk)

    def _route(self, path: str, query: dict[str, str]) -> None:
        if path in ("/", "/index.html"):
            self._static("index.html")
        elif path.startswith("/static/"):
            self._static(path.removeprefix("/static/"))
        elif path == "/api/charts":
            self._json(HTTPStatus.OK, self.store.charts(query.get("run")))
        elif path == "/api/runs":
            self._json(HTTPStatus.OK, {"root": str(self.store.root), "runs": self.store.runs()})
        elif path == "/api/sweep":
            self._json(HTTPStatus.OK, self.store.sweep())
        elif path == "/api/samples":
            self._json(HTTPStatus.OK, self.store.samples(query.get("run", "")))
        elif path == "/api/videos":
            self._json(HTTPStatus.OK, self.store.videos(query.get("run", ".")))
        elif path == "/video":
            self._video(query.get("run", "."), query.get("name", ""))
        elif path == "/api/metrics":
            since = min(max(int(query.get("since", "0")), 0), 1 << 40)
            self._json(HTTPStatus.OK, self.store.metrics(query.get("run", "."), since))
        else:
            raise ApiError(HTTPStatus.NOT_FOUND, f"no page {path}")

    def do_GET(self) -> None:
        if not self._host_allowed():
            self._json(HTTPStatus.FORBIDDEN, {"error": "unexpected Host header"})
            return
        url = urlparse(self.path)
        try:
            self._route(url.path, {k: v[0] for k, v in parse_qs(url.query).items()})
        except ApiError as err:
            self._json(err.status, {"error": str(err)})
        except ValueError:
            self._json(HTTPStatus.BAD_REQUEST, {"error": "since must be a whole number"})


class Unsatisfiable(ValueError):
    """A range that starts past the end of the file (416)."""


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one byte range a `Range: bytes=a-b` header asks for, as (first, last) within the file;
    None without a usable header (the whole file); Unsatisfiable when it starts past the end.
    Several ranges are answered with the first (browsers ask for one)."""
    if not header or not header.strip().startswith("bytes="):
        return None
    first = header.strip().removeprefix("bytes=").split(",")[0].strip()
    a, sep, b = first.partition("-")
    if not sep or not (a.isdigit() or b.isdigit()) or (a and not a.isdigit()) or (b and not b.isdigit()):
        return None
    if not a:  # the last b bytes
        n = int(b)
        if n == 0 or size == 0:
            raise Unsatisfiable(header)
        return max(size - n, 0), size - 1
    start = int(a)
    if start >= size:
        raise Unsatisfiable(header)
    end = min(int(b), size - 1) if b else size - 1
    return (start, end) if end >= start else None


def make_handler(store: RunStore) -> type[Handler]:
    return type("BoundHandler", (Handler,), {"store": store})


def allowed_hosts(host: str, port: int) -> frozenset[str] | None:
    """Host headers a server bound to host:port answers: loopback names on that port when it is
    on a loopback address, else any (the user chose to expose it)."""
    if host != "::1" and not host.startswith("127."):
        return None
    return frozenset({f"{name}:{port}" for name in LOOPBACK_NAMES} | {f"{host}:{port}"})


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-response is routine (a closed tab, a timed-out poll): not worth a
    traceback each. Anything else is said in one line."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, ConnectionError | TimeoutError):
            return
        print(f"relay dashboard: request from {client_address[0]} failed: {err!r}"[:300], file=sys.stderr)


class Dashboard:
    """The server on a background thread (for `relay train --dashboard` and tests) or in front."""

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.store = RunStore(root)
        handler = make_handler(self.store)
        self.server = QuietServer((host, port), handler)
        self.server.daemon_threads = True
        handler.allowed_hosts = allowed_hosts(host, self.server.server_address[1])
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
