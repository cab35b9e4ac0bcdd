"""The dashboard on a sweep's folder: /api/sweep reads the sweep's records as data, and a real
headless Chromium colours the trials by a swept value, plots each value against the trial's best
return, and lists PBT's lineage jumps (screenshot saved under artifacts/).

The folder is laid out as `relay sweep` writes it (sweep.yaml, trials.jsonl, one run directory per
trial, exploits.jsonl), with metrics lines written here so the test controls every number.
"""

import json
from pathlib import Path

import pytest

from relay_rl.contracts.config import dump_config, load_config
from relay_rl.services.dashboard.server import Dashboard
from tests.browser import page_at
from tests.services.test_dashboard import ARTIFACTS, get, line

ROOT = Path(__file__).parents[2]
LRS = {"t000": 1e-4, "t001": 1e-3, "t002": 3e-3}
BEST = {"t000": 60.0, "t001": 200.0, "t002": 140.0}


@pytest.fixture
def sweep_dir(tmp_path):
    root = tmp_path / "sweep-x"
    root.mkdir()
    cfg = load_config(ROOT / "configs/cartpole_ppo.yaml", ["sweep.scheduler=pbt"])
    cfg = cfg.model_copy(
        update={"sweep": cfg.sweep.model_copy(update={"params": {"learner.lr": "loguniform(1e-4, 3e-3)"}})}
    )
    (root / "sweep.yaml").write_text(dump_config(cfg))
    log = []
    for trial, lr in LRS.items():
        (root / trial).mkdir()
        (root / trial / "config.yaml").write_text(dump_config(cfg))
        lines = [line(i, episode_return_mean=BEST[trial] * i / 4) for i in range(1, 5)]
        (root / trial / "metrics.jsonl").write_text("".join(lines))
        log += [
            {"t": 1.0, "trial": trial, "event": e, "params": {"learner.lr": lr}}
            for e in ("planned", "started")
        ]
    log.append({"t": 2.0, "trial": "t000", "event": "ended", "status": "done", "why": "its stop criterion"})
    (root / "trials.jsonl").write_text("".join(json.dumps(x) + "\n" for x in log))
    exploit = {"iteration": 3, "from_trial": "t001", "from_iteration": 3, "params": {"learner.lr": 8e-4}}
    (root / "t000" / "exploits.jsonl").write_text(json.dumps(exploit) + "\n")
    board = Dashboard(root, port=0).start()
    yield root, board
    board.stop()


def test_api_sweep_reads_the_records(sweep_dir, tmp_path):
    root, board = sweep_dir
    status, body = get(board, "/api/sweep")
    assert status == 200
    sweep = body["sweep"]
    assert (
        sweep["metric"] == "episode_return_mean"
        and sweep["mode"] == "max"
        and sweep["params"] == ["learner.lr"]
    )
    assert sweep["trials"]["t001"]["params"] == {"learner.lr": 1e-3}
    assert sweep["trials"]["t000"]["status"] == "done"
    assert sweep["trials"]["t001"]["status"] == "running or interrupted"
    assert sweep["trials"]["t000"]["exploits"] == [
        {"iteration": 3, "from_trial": "t001", "from_iteration": 3}
    ]
    plain = Dashboard(tmp_path / "sweep-x" / "t000", port=0).start()
    try:
        assert get(plain, "/api/sweep") == (200, {"sweep": None})  # a run, not a sweep
    finally:
        plain.stop()
    (root / "sweep.yaml").write_text("learner: {lr: -1}\n")
    status, body = get(board, "/api/sweep")
    assert status == 409 and "learner.lr" in body["error"]


def test_a_real_browser_compares_the_trials(sweep_dir):
    _root, board = sweep_dir
    ARTIFACTS.mkdir(exist_ok=True)
    with page_at(board.url, height=1100) as (page, errors):
        page.wait_for_function(
            "window.relayDashboard && window.relayDashboard.sweep().scatterPoints === 3", timeout=20000
        )
        state = page.evaluate("window.relayDashboard.sweep()")
        assert state["colourBy"] == "learner.lr"
        colours = state["colours"]
        # coloured by lr on a log scale: the lowest blue, the highest red, each its own
        assert colours["t000"] == "hsl(240, 75%, 45%)" and colours["t002"] == "hsl(0, 75%, 45%)"
        assert len(set(colours.values())) == 3
        titles = page.locator("#scatter circle title").evaluate_all("ts => ts.map(t => t.textContent)")
        assert any("t001" in t and "best episode_return_mean 200" in t for t in titles), titles
        # the best trial sits highest: the smallest y
        ys = {
            t.split(":")[0]: float(c)
            for t, c in zip(
                titles,
                page.locator("#scatter circle").evaluate_all("cs => cs.map(c => c.getAttribute('cy'))"),
                strict=True,
            )
        }
        assert min(ys, key=ys.get) == "t001" and max(ys, key=ys.get) == "t000"
        assert "t000 took t001's checkpoint" in page.locator("#lineage").inner_text()
        assert page.locator("#runs label").count() == 3
        page.screenshot(path=str(ARTIFACTS / "dashboard-sweep.png"), full_page=True)
    assert not errors, errors


def test_api_sweep_stays_in_its_folder_and_skips_lines_of_the_wrong_types(sweep_dir, tmp_path):
    """A trials.jsonl naming `../outside` (a run folder beside the sweep's) and lines of the wrong
    types: the view lists only the sweep's own trials, counts the skipped lines, and answers (it
    dropped the connection on `"params": 5`)."""
    root, board = sweep_dir
    outside = root.parent / "outside"
    outside.mkdir()
    (outside / "metrics.jsonl").write_text(line(1, episode_return_mean=999.0))
    bad = [
        {"trial": "../outside", "event": "started", "params": {"learner.lr": 0.5}},
        {"trial": "t001", "event": "started", "params": 5},
        {"trial": "t002", "event": "ended", "status": {"x": 1}},
    ]
    with (root / "trials.jsonl").open("a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in bad))
    status, body = get(board, "/api/sweep")
    assert status == 200
    assert sorted(body["sweep"]["trials"]) == ["t000", "t001", "t002"]
    assert body["sweep"]["skipped_lines"] == 3
    assert body["sweep"]["trials"]["t001"]["params"] == {"learner.lr": LRS["t001"]}
