"""The learner metrics dashboard: its HTTP API's edge cases, and a real headless Chromium watching
the return chart gain points as metrics.jsonl lines land (screenshot saved under artifacts/)."""

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_rl.services.dashboard.server import Dashboard, RunStore
from tests.browser import page_at

ROOT = Path(__file__).parents[2]
ARTIFACTS = ROOT / "artifacts"


def line(i: int, **extra) -> str:
    rec = {
        "iteration": i,
        "env_steps": 1024 * i,
        "wall_s": 0.2 * i,
        "episode_return_mean": 20.0 + 10 * i,
        "episode_return_min": 10.0 + 5 * i,
        "episode_return_max": 40.0 + 12 * i,
        "episode_len_mean": 20.0 + 10 * i,
        "policy_loss": -0.01,
        "value_loss": 1.0 / i,
        "entropy": 0.69 - 0.01 * i,
        "approx_kl": 0.004,
        "clip_fraction": 0.05,
        "explained_variance": 0.5,
        "grad_norm": 0.3,
        "lr": 1e-3,
        "env_steps_per_s": 5000.0,
        "learner_samples_per_s": 90000.0,
        "policy_lag_mean": 0.0,
        "weights_version": i,
        "buffer_fill": 1.0,
        "device_memory_bytes": 0,
        "device_memory_peak_bytes": 0,
        "amp_skipped_steps": 0,
        "worker_restarts": 0,
        "rejected_segments": 0,
        **extra,
    }
    return json.dumps(rec) + "\n"


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    (root / "a").mkdir(parents=True)
    (root / "a" / "metrics.jsonl").write_text("".join(line(i) for i in range(1, 4)))
    (root / "empty").mkdir()
    (root / "empty" / "config.yaml").write_text("env: {}\n")
    board = Dashboard(root, port=0).start()
    yield root, board
    board.stop()


def get(board, path):
    try:
        with urllib.request.urlopen(board.url.rstrip("/") + path, timeout=10) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_api_lists_runs_and_serves_lines_incrementally(runs):
    root, board = runs
    assert get(board, "/api/runs") == (200, {"root": str(root.resolve()), "runs": ["a", "empty"]})
    status, body = get(board, "/api/metrics?run=a&since=1")
    assert status == 200 and body["next"] == 3 and [x["iteration"] for x in body["lines"]] == [2, 3]
    assert get(board, "/api/metrics?run=empty")[1] == {
        "run": "empty",
        "next": 0,
        "lines": [],
        "note": "no metrics yet",
    }


def test_polls_read_only_new_lines_and_survive_a_replaced_file(runs):
    """Later polls start where the last one ended; a resume's rewritten file is read afresh."""
    root, board = runs
    metrics = root / "a" / "metrics.jsonl"
    assert get(board, "/api/metrics?run=a&since=0")[1]["next"] == 3
    with metrics.open("a") as f:
        f.write(line(4) + line(5))
    body = get(board, "/api/metrics?run=a&since=3")[1]
    assert body["next"] == 5 and [x["iteration"] for x in body["lines"]] == [4, 5]
    # the store read from the byte where line 3 ended, not from the start
    assert board.store._ends["a"][1:] == (5, metrics.stat().st_size)
    # a resume truncates through os.replace: a new file whose lines differ past the checkpoint
    tmp = metrics.with_suffix(".tmp")
    tmp.write_text(line(1) + line(2) + line(3, episode_return_mean=-7.0))
    tmp.replace(metrics)
    body = get(board, "/api/metrics?run=a&since=2")[1]
    assert body["next"] == 3 and body["lines"][0]["episode_return_mean"] == -7.0
    assert get(board, "/api/metrics?run=a&since=0")[1]["next"] == 3  # a new page starts over


def test_torn_last_line_waits_until_complete(runs):
    root, board = runs
    with (root / "a" / "metrics.jsonl").open("a") as f:
        f.write(line(4)[:40])
    assert get(board, "/api/metrics?run=a&since=3")[1]["lines"] == []
    with (root / "a" / "metrics.jsonl").open("a") as f:
        f.write(line(4)[40:])
    assert [x["iteration"] for x in get(board, "/api/metrics?run=a&since=3")[1]["lines"]] == [4]


def test_missing_vanished_and_outside_runs_get_clear_errors(runs):
    root, board = runs
    assert get(board, "/api/metrics?run=nope") == (
        404,
        {"error": "run 'nope' not found (or its directory was removed)"},
    )
    assert get(board, "/api/metrics?run=../../etc")[0] == 403
    assert get(board, "/static/../dashboard.py")[0] == 404
    assert get(board, "/api/metrics?run=a&since=x")[0] == 400
    shutil.rmtree(root / "a")
    assert get(board, "/api/metrics?run=a")[0] == 404
    shutil.rmtree(root)
    status, body = get(board, "/api/runs")
    assert status == 404 and "does not exist" in body["error"]


def test_a_real_browser_watches_the_return_chart_grow(runs):
    """Headless Chromium (found, or Debian's package installed by tests/browser.py; driven by
    Playwright) loads the page of a run being written."""
    root, board = runs
    ARTIFACTS.mkdir(exist_ok=True)
    with page_at(board.url) as (page, errors):
        page.wait_for_function(
            "window.relayDashboard && window.relayDashboard.points('return') === 3", timeout=20000
        )
        with (root / "a" / "metrics.jsonl").open("a") as f:
            f.write("".join(line(i) for i in range(4, 12)))
        page.wait_for_function("window.relayDashboard.points('return') === 11", timeout=20000)
        assert page.locator("#card-return canvas").count() == 1
        assert page.locator(".card").count() >= 14
        assert "2 run(s)" in page.locator("#status").inner_text()
        page.screenshot(path=str(ARTIFACTS / "dashboard-test.png"), full_page=True)
    assert not errors, errors
    assert (ARTIFACTS / "dashboard-test.png").stat().st_size > 10_000


def test_a_run_of_policy_groups_gets_a_line_per_group(tmp_path):
    """The per-policy charts draw each group's keys ("policy/<group>/entropy",
    "policy_return_mean/<group>") as the lines name them; a run without groups shows none."""
    root = tmp_path / "runs"
    (root / "tag").mkdir(parents=True)
    per_group = {
        f"{key}": value
        for group, sign in (("predator", 1), ("prey", -1))
        for key, value in (
            (f"policy_return_mean/{group}", 5.0 * sign),
            (f"policy/{group}/entropy", 1.5),
            (f"policy/{group}/approx_kl", 0.01),
        )
    }
    (root / "tag" / "metrics.jsonl").write_text("".join(line(i, **per_group) for i in range(1, 4)))
    board = Dashboard(root, port=0).start()
    try:
        with page_at(board.url) as (page, errors):
            page.wait_for_function("window.relayDashboard.points('policy_groups') === 3", timeout=20000)
            labels = page.evaluate("window.relayDashboard.series('policy_groups')")
            assert labels == ["tag policy_return_mean/predator", "tag policy_return_mean/prey"]
            learning = page.evaluate("window.relayDashboard.series('policy_groups_learning')")
            assert "tag policy/prey/approx_kl" in learning and len(learning) == 4
        assert not errors, errors
    finally:
        board.stop()


def _raw_get(board, path: str, host: str | None = None) -> tuple[int, bytes]:
    """A GET with a chosen Host header (urllib always sends the right one)."""
    import http.client

    port = board.server.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("GET", path, skip_host=True)
    conn.putheader("Host", host or f"127.0.0.1:{port}")
    conn.endheaders()
    res = conn.getresponse()
    body = res.read()
    conn.close()
    return res.status, body


def test_bad_lines_are_null_non_finite_numbers_are_null_and_later_lines_are_served(runs):
    root, board = runs
    with (root / "a" / "metrics.jsonl").open("ab") as f:
        f.write(b'{"iteration": 4, "bad": "\xff\xfe"}\n')  # not UTF-8
        f.write(b'{"iteration": 5, "policy_loss": NaN, "grad_norm": Infinity, "x": 1e999}\n')
        f.write(b"[1, 2]\n")  # JSON, but not an object
        f.write(line(6).encode())
    status, raw = _raw_get(board, "/api/metrics?run=a&since=3")
    assert status == 200
    body = json.loads(raw)  # strict JSON: NaN/Infinity would not parse in a browser
    assert b"NaN" not in raw and b"Infinity" not in raw
    assert body["lines"][0] is None and body["lines"][2] is None
    assert body["lines"][1] == {"iteration": 5, "policy_loss": None, "grad_norm": None, "x": None}
    assert body["lines"][3]["iteration"] == 6 and body["next"] == 7


def test_fifos_directories_and_links_out_of_the_folder_are_refused_and_serving_goes_on(runs, tmp_path):
    import os

    root, board = runs
    (root / "fifo").mkdir()
    os.mkfifo(root / "fifo" / "metrics.jsonl")
    (root / "dir" / "metrics.jsonl").mkdir(parents=True)
    (root / "dir" / "config.yaml").write_text("env: {}\n")
    outside = tmp_path / "secret.jsonl"
    outside.write_text('{"iteration": 1, "secret": 42}\n')
    (root / "link").mkdir()
    (root / "link" / "metrics.jsonl").symlink_to(outside)
    (root / "inside").mkdir()
    (root / "inside" / "metrics.jsonl").symlink_to(root / "a" / "metrics.jsonl")
    assert get(board, "/api/metrics?run=fifo")[0] == 409  # answered at once, no thread hangs
    assert get(board, "/api/metrics?run=dir")[0] == 409
    status, body = get(board, "/api/metrics?run=link")
    assert status == 403 and "secret" not in json.dumps(body)
    assert get(board, "/api/metrics?run=inside")[1]["next"] == 3
    assert get(board, "/api/metrics?run=a")[0] == 200


def test_an_over_long_line_is_skipped_and_responses_are_capped(runs, monkeypatch):
    from relay_rl.services.dashboard import server

    root, board = runs
    metrics = root / "a" / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"iteration": 4, "blob": "' + "x" * (server.MAX_LINE_BYTES + 10) + '"}\n')
        f.write(line(5))
    status, raw = _raw_get(board, "/api/metrics?run=a&since=3")
    body = json.loads(raw)
    assert status == 200 and body["lines"][0] is None and body["lines"][1]["iteration"] == 5
    assert len(raw) < 10_000
    monkeypatch.setattr(server, "MAX_RESPONSE_BYTES", 2 * len(line(1)))
    first = get(board, "/api/metrics?run=a&since=0")[1]
    assert first["next"] == 2  # a capped response; the page asks again from `next`
    # Lines 3, the skipped one (sent as null: 4 bytes of the body) and 5 fit the second answer.
    assert get(board, f"/api/metrics?run=a&since={first['next']}")[1]["next"] == 5


def test_the_cap_holds_for_the_body_as_sent_even_when_escapes_make_lines_grow(runs):
    """Non-ASCII text is sent escaped (é: 2 bytes on disk, 6 in the body); the cap counts the
    body, not the file."""
    from relay_rl.services.dashboard import server

    root, board = runs
    with (root / "a" / "metrics.jsonl").open("a", encoding="utf-8") as f:
        for i in range(4, 2500):
            f.write(json.dumps({"iteration": i, "note": "é" * 1000}, ensure_ascii=False) + "\n")
    status, raw = _raw_get(board, "/api/metrics?run=a&since=0")
    body = json.loads(raw)
    assert status == 200 and len(raw) <= server.MAX_RESPONSE_BYTES
    assert 3 < body["next"] < 2499  # capped: the page asks again from `next`
    rest = json.loads(_raw_get(board, f"/api/metrics?run=a&since={body['next']}")[1])
    assert rest["lines"][0]["iteration"] == body["next"] + 1


def test_clients_that_hang_up_leave_no_tracebacks(runs, capfd):
    import socket

    root, board = runs
    with (root / "a" / "metrics.jsonl").open("a") as f:  # answers of megabytes: writes meet the reset
        f.write("".join(line(i, note="x" * 1000) for i in range(4, 3000)))
    host, port = board.server.server_address[:2]
    for _ in range(50):
        with socket.create_connection((host, port)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.sendall(f"GET /api/metrics?run=a HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        # closed with a reset before the answer is read
    assert get(board, "/api/runs")[0] == 200  # still serving
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err and "ConnectionReset" not in err


def test_host_header_must_name_the_loopback_address(runs):
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends Host: evil.example."""
    _, board = runs
    port = board.server.server_address[1]
    assert _raw_get(board, "/api/runs", host=f"evil.example:{port}")[0] == 403
    assert _raw_get(board, "/api/runs", host="127.0.0.1:1")[0] == 403
    assert _raw_get(board, "/api/runs", host=f"localhost:{port}")[0] == 200
    assert _raw_get(board, "/api/runs")[0] == 200


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=200).filter(lambda b: b"\n" not in b), max_size=12))
def test_any_bytes_in_metrics_get_strict_json_with_one_entry_per_line(tmp_path_factory, chunks):
    """What the server sends for a run: the store's answer, encoded as strict JSON."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "metrics.jsonl").write_bytes(b"".join(c + b"\n" for c in chunks))
    body = json.loads(json.dumps(RunStore(root).metrics(".", 0), allow_nan=False))
    assert len(body["lines"]) == len(chunks) == body["next"]
    assert all(x is None or isinstance(x, dict) for x in body["lines"])


def test_a_single_cpu_run_shows_only_what_applies_in_units_people_read(tmp_path):
    """One local run on a CPU learner, memoryless: no sweep panel, no recurrent-state card, no
    device-utilization series; memory axes and values in MiB/GiB, not cut-off raw bytes; the speed
    chart smoothed over 10 iterations."""
    root = tmp_path / "run"
    root.mkdir()
    extra = lambda i: {  # noqa: E731
        "learner_busy": 0.4,
        "device_memory_bytes": 3.5 * 2**30 + i,
        "learner_rss_bytes": 812 * 2**20,
        "env_steps_per_s": 1000.0 if i % 2 else 3000.0,  # a sawtooth: smoothed to ~2000
    }
    (root / "metrics.jsonl").write_text("".join(line(i, **extra(i)) for i in range(1, 21)))
    board = Dashboard(root, port=0).start()
    try:
        with page_at(board.url) as (page, errors):
            page.wait_for_function("window.relayDashboard.points('memory') === 20", timeout=20000)
            assert not page.locator("#sweep").is_visible()
            assert (
                page.locator("#card-recurrent").count() == 0
                or not page.locator("#card-recurrent").is_visible()
            )
            assert page.evaluate("window.relayDashboard.series('busy')") == [" learner_busy"]
            assert not page.locator("#card-eval").is_visible()  # no evaluation ran
            memory = page.locator("#card-memory").inner_text()
            assert "3.5 GiB" in memory and "000,000" not in memory, memory
            ticks = page.evaluate("window.relayDashboard.ticks('memory')")
            assert ticks and all(t.split()[-1] in ("B", "KiB", "MiB", "GiB") for t in ticks), ticks
            assert "2 GiB" in ticks, ticks  # steps of a power of two
            speed = page.evaluate("window.relayDashboard.values('speed', 1)")
            assert all(1900 <= v <= 2100 for v in speed[10:]), speed
            page.screenshot(path=str(ARTIFACTS / "dashboard-single-run.png"), full_page=True)
        assert not errors, errors
    finally:
        board.stop()
