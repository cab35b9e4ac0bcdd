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


@pytest.fixture
def family_board(tmp_path):
    """Two runs side by side: a language run (its config.yaml names a causal LM) and an env run,
    each with lines carrying both families' keys, so only the family decides what is drawn."""
    root = tmp_path / "runs"
    for name, kind in (("lm", "causal_lm"), ("env", "mlp")):
        run = root / name
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(f"model: {{kind: {kind}, path: m}}\n")
        lines = [
            {
                "iteration": i,
                "env_steps": 100 * i,
                "wall_s": i,
                "reward_mean": 0.1 * i,
                "reward_0_mean": 0.1 * i,
                "episode_return_mean": 0.1 * i,
                "completion_len_mean": 5,
                "truncated_fraction": 0.2,
                "policy_loss": 0.5,
                "num_workers": 1,
                "env_faults": 0,
                "buffer_fill": 1.0,
            }
            for i in range(1, 4)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    boards = [Dashboard(root / name, port=0).start() for name in ("lm", "env")]
    yield boards
    for b in boards:
        b.stop()


def test_a_language_runs_dashboard_is_in_its_own_words(family_board):
    """#59: the reward (and each reward's part) first, then completion lengths and the cut
    fraction, against iterations; no panel that cannot apply to a language run (env faults,
    rollout workers, the ring buffer). An env run keeps its panels against env steps."""
    lm, env = family_board
    status, body = _get(lm, "/api/charts?run=.")
    assert status == 200 and body["x"] == {"key": "iteration", "label": "iterations"}
    ids = [c["id"] for c in body["charts"]]
    assert ids[:4] == ["lm_reward", "eval", "lm_length", "lm_truncated"]
    assert {"env_faults", "workers", "buffer", "return", "length"}.isdisjoint(ids)
    with page_at(lm.url) as (page, errors):
        page.wait_for_function("window.relayDashboard.points('lm_reward') >= 3", timeout=30000)
        cards = page.evaluate("window.relayDashboard.cards()")
        assert cards[:3] == ["lm_reward", "lm_length", "lm_truncated"] and "workers" not in cards
        assert page.evaluate("window.relayDashboard.xLabel()") == "iterations"
        assert page.evaluate("window.relayDashboard.values('lm_reward', 0)") == [1, 2, 3]  # x: iterations
    assert not errors, errors
    with page_at(env.url) as (page, errors):
        page.wait_for_function("window.relayDashboard.points('loss') >= 3", timeout=30000)
        cards = page.evaluate("window.relayDashboard.cards()")
        assert "workers" in cards and "lm_reward" in cards  # every chart whose keys the lines carry
        assert page.evaluate("window.relayDashboard.xLabel()") == "env steps"
        assert page.evaluate("window.relayDashboard.values('loss', 0)") == [100, 200, 300]
    assert not errors, errors
