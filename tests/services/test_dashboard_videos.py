"""Evaluation videos in the dashboard: listed by iteration, served as video/mp4 with HTTP range
requests (what a browser seeks with), only from a run's videos/ folder; and a real headless
Chromium playing the newest one and stepping back to an older one (screenshot under artifacts/)."""

import http.client
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.rollout_workers.video import encode_mp4
from relay_rl.services.dashboard.server import Dashboard, Unsatisfiable, byte_range
from tests.browser import ARGS as CHROMIUM_ARGS
from tests.browser import chromium

ROOT = Path(__file__).parents[2]


def clip(seconds: float, shade: int) -> bytes:
    """A real H.264 MP4 of moving bars, as the evaluator writes them."""
    frames = []
    for i in range(int(seconds * 25)):
        img = np.full((96, 128, 3), shade, dtype=np.uint8)
        img[:, (i * 4) % 128 : (i * 4) % 128 + 8] = 255
        frames.append(img)
    return encode_mp4(frames, 25, {"comment": "test"})


@pytest.fixture
def board(tmp_path):
    root = tmp_path / "runs"
    videos = root / "a" / "videos"
    videos.mkdir(parents=True)
    (root / "a" / "metrics.jsonl").write_text(
        json.dumps({"iteration": 1, "env_steps": 10, "wall_s": 1}) + "\n"
    )
    (videos / "iter-000040-return-120.mp4").write_bytes(clip(2.0, 40))
    (videos / "iter-000010-return-m3.mp4").write_bytes(clip(1.0, 90))
    (videos / "notes.txt").write_text("not a video")
    board = Dashboard(root, port=0).start()
    yield root, board
    board.stop()


def request(board, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    port = board.server.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers=headers or {})
    res = conn.getresponse()
    body = res.read()
    conn.close()
    return res.status, {k.lower(): v for k, v in res.getheaders()}, body


def test_videos_are_listed_oldest_first_with_iteration_and_return(board):
    root, b = board
    status, _, body = request(b, "/api/videos?run=a")
    assert status == 200
    listed = json.loads(body)["videos"]
    assert [(v["iteration"], v["return"]) for v in listed] == [(10, -3), (40, 120)]
    assert listed[1]["bytes"] == (root / "a" / "videos" / "iter-000040-return-120.mp4").stat().st_size
    assert json.loads(request(b, "/api/videos?run=nope")[2])["error"]


def test_a_video_is_served_whole_and_by_ranges(board):
    root, b = board
    data = (root / "a" / "videos" / "iter-000040-return-120.mp4").read_bytes()
    path = "/video?run=a&name=iter-000040-return-120.mp4"
    status, headers, body = request(b, path)
    assert status == 200 and body == data
    assert headers["content-type"] == "video/mp4" and headers["accept-ranges"] == "bytes"
    status, headers, body = request(b, path, {"Range": "bytes=100-199"})
    assert status == 206 and body == data[100:200]
    assert headers["content-range"] == f"bytes 100-199/{len(data)}"
    status, headers, body = request(b, path, {"Range": "bytes=-50"})
    assert status == 206 and body == data[-50:]
    status, headers, body = request(b, path, {"Range": f"bytes={len(data) - 10}-"})
    assert status == 206 and body == data[-10:]
    status, headers, _ = request(b, path, {"Range": f"bytes={len(data)}-"})
    assert status == 416 and headers["content-range"] == f"bytes */{len(data)}"


def test_only_a_runs_own_videos_are_served(board, tmp_path):
    root, b = board
    secret = tmp_path / "secret.mp4"
    secret.write_bytes(b"secret bytes")
    videos = root / "a" / "videos"
    (videos / "iter-000050-return-1.mp4").symlink_to(secret)
    os.mkfifo(videos / "iter-000060-return-1.mp4")
    (root / "b").mkdir()
    (root / "b" / "metrics.jsonl").write_text("")
    (root / "b" / "videos").symlink_to(videos)
    for path, status in [
        ("/video?run=a&name=notes.txt", 404),
        ("/video?run=a&name=../metrics.jsonl", 404),
        ("/video?run=a&name=iter-000050-return-1.mp4", 403),  # a link
        ("/video?run=a&name=iter-000060-return-1.mp4", 409),  # a FIFO: answered at once
        ("/video?run=b&name=iter-000040-return-120.mp4", 403),  # a linked folder
        ("/video?run=..&name=iter-000040-return-120.mp4", 403),
        ("/video?run=a&name=iter-000070-return-1.mp4", 404),
    ]:
        got, _, body = request(b, path)
        assert got == status, (path, got, body)
        assert b"secret bytes" not in body
    listed = json.loads(request(b, "/api/videos?run=a")[2])["videos"]
    assert [v["iteration"] for v in listed] == [10, 40]  # neither the link nor the FIFO


@settings(max_examples=300, deadline=None)
@given(
    header=st.one_of(
        st.none(), st.text(max_size=30), st.from_regex(r"bytes=\d{0,6}-\d{0,6}", fullmatch=True)
    ),
    size=st.integers(0, 10**6),
)
def test_any_range_header_is_a_range_inside_the_file_the_whole_file_or_416(header, size):
    try:
        got = byte_range(header, size)
    except Unsatisfiable:
        return
    if got is not None:
        first, last = got
        assert 0 <= first <= last < size


def test_a_real_browser_plays_the_newest_video_and_steps_back(board):
    """Headless Chromium (tests/browser.py) loads the dashboard: the newest video plays (its
    readyState, its duration, a currentTime that advances); the older one is a click away."""
    from playwright.sync_api import sync_playwright

    _, b = board
    shown = (
        "(() => { const v = window.relayDashboard.video(); "
        "return v && v.iteration === %d && v.readyState >= %d; })()"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium(), args=[*CHROMIUM_ARGS, "--autoplay-policy=no-user-gesture-required"]
        )
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(b.url)
        page.wait_for_function(
            shown % (40, 3),
            timeout=30000,
        )
        first = page.evaluate("window.relayDashboard.video()")
        assert first["error"] is None and first["duration"] == pytest.approx(2.0, abs=0.1)
        page.wait_for_function("window.relayDashboard.video().currentTime > 0.3", timeout=20000)
        assert "iteration 40, return 120 (2 of 2)" in page.locator("#video-caption").inner_text()
        page.screenshot(path=str(ROOT / "artifacts" / "dashboard-video-test.png"), full_page=True)
        page.click("#video-older")
        page.wait_for_function(
            shown % (10, 1),
            timeout=20000,
        )
        assert page.evaluate("window.relayDashboard.video().duration") == pytest.approx(1.0, abs=0.1)
        assert "return -3 (1 of 2)" in page.locator("#video-caption").inner_text()
        browser.close()
    assert not errors, errors
