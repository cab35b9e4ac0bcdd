"""A language run's samples in the dashboard: /api/samples serves the newest lines of
samples.jsonl (newest first, bounded, never through a link), and a real headless Chromium shows
them as a table whose texts stay text (a completion that looks like HTML is not markup)."""

import http.client
import json
import os

import pytest

from relay_rl.services.dashboard.server import SAMPLES_SHOWN, Dashboard
from relay_rl.services.runs.run_dir import SAMPLE_CHARS, RunDir
from tests.browser import page_at


@pytest.fixture
def board(tmp_path):
    root = tmp_path / "runs"
    run = RunDir(root / "lm")
    run.root.mkdir(parents=True)
    run.metrics_path.write_text(
        json.dumps({"iteration": 1, "env_steps": 10, "wall_s": 1, "reward_mean": 0.5}) + "\n"
    )
    for i in range(1, 6):
        run.append_samples(
            i,
            [
                {"prompt": f"{i}+{i}=", "completion": "<b>" + str(2 * i) + "</b>", "reward": 1.0},
                {
                    "prompt": [{"role": "user", "content": "x" * (SAMPLE_CHARS + 50)}],
                    "completion": "?",
                    "reward": None,
                },
            ],
        )
    board = Dashboard(root, port=0).start()
    yield root, board
    board.stop()


def _get(board, path):
    conn = http.client.HTTPConnection("127.0.0.1", board.server.server_address[1], timeout=10)
    conn.request("GET", path)
    res = conn.getresponse()
    body = res.read()
    conn.close()
    return res.status, json.loads(body)


def test_samples_api_serves_the_newest_first_cut_and_bounded(board):
    root, b = board
    status, body = _get(b, "/api/samples?run=lm")
    assert status == 200
    got = body["samples"]
    assert len(got) == min(SAMPLES_SHOWN, 10) and got[0]["iteration"] == 5 and got[-1]["iteration"] == 1
    assert got[0]["reward"] is None and len(got[0]["prompt"]) == SAMPLE_CHARS  # messages, as JSON, cut
    assert got[1]["completion"] == "<b>10</b>"
    # samples.jsonl made a link: nothing is read through it
    path = root / "lm" / "samples.jsonl"
    os.replace(path, root / "elsewhere.jsonl")
    path.symlink_to(root / "elsewhere.jsonl")
    assert _get(b, "/api/samples?run=lm")[1]["samples"] == []


def test_the_page_shows_samples_as_text(board):
    _, b = board
    with page_at(b.url) as (page, errors):
        page.wait_for_function("window.relayDashboard.samples().length >= 10", timeout=30000)
        rows = page.evaluate("window.relayDashboard.samples()")
        assert rows[1][:4] == ["5", "5+5=", "<b>10</b>", "1.00"]  # the tags shown, not rendered
        assert rows[0][3] == "none (a reward fault)"
        assert page.locator("#samples b").count() == 0
    assert not errors, errors
