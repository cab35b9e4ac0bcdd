"""The documentation: a short README whose links resolve, a docs site that builds with broken links
as errors (MkDocs strict), and a config reference that is what the code says today."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from relay_rl.services import config_reference

ROOT = Path(__file__).parents[1]


def test_the_readme_is_a_landing_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links and all((ROOT / link).exists() for link in links if "://" not in link), links
    for family in ("Quickstart: an env run", "Quickstart: a language run"):
        assert family in text


def test_the_config_reference_is_what_the_code_says():
    """Regenerate with `python -m relay_rl.services.config_reference` when this fails."""
    assert config_reference.DOCS_FILE.read_text() == config_reference.render()
    page = config_reference.render()
    leaves = ("`learner.lm.policy_loss`", "`learner.gspo.clip_ratio_low`", "`stop.iterations`")
    for leaf in (*leaves, "`learner.bradley_terry.max_tokens`"):
        assert leaf in page
    assert "Choices: ppo, grpo, rloo, reinforce_pp, bradley_terry." in page


def test_the_docs_site_builds_with_no_broken_link(tmp_path):
    docs = ROOT / "docs"
    out = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
        "-f",
        str(ROOT / "mkdocs.yml"),
        "-d",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "extending" / "index.html").is_file() and (
        out / "reference" / "config" / "index.html"
    ).is_file()
    # the check is live: a page with a broken link fails the build
    broken = tmp_path / "broken"
    broken.mkdir()
    for page in docs.iterdir():
        target = broken / page.name
        target.symlink_to(page)
    (broken / "index.md").unlink()
    (broken / "index.md").write_text((docs / "index.md").read_text() + "\n[gone](no-such-page.md)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text((ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {broken}"))
    failed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(tmp_path / "s2")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert failed.returncode != 0 and "no-such-page.md" in failed.stderr
