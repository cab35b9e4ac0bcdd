"""The config reference of the docs site, generated from the config model and the registries:
`python -m relay_rl.services.config_reference [--check]` writes `docs/reference/config.md` (or,
with --check, exits 1 where the file differs from what the code says: CI runs it through a test).

Each section's leaves with their defaults, descriptions and registered names, the registry
entries' own sections (an algorithm's, an estimator's, a loss's, a model kind's, a tracker's)
under the section they belong to, and for each section which family of runs reads it."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from ..contracts.config import config_leaves
from ..services.driver.preflight import choices
from ..services.runs.config_sections import entry_sections

DOCS_FILE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md"
HEADER = """# Config reference

Generated from the code by `python -m relay_rl.services.config_reference` (a test fails when this
page is stale). Every leaf takes `--set path=value`; unknown keys are errors. `relay validate
--help-config` prints the same on the command line.

Sections of registry entries (`learner.<name>`, `model.<name>`, `metrics.<name>`) are read only by
the entry of that name; `learner.lm`, the estimators' and the policy losses' sections only by
language runs (`model.kind: causal_lm`), the env algorithms' only by env runs.
"""


def _value(default: object) -> str:
    text = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
    return text.replace("|", "\\|")


def render() -> str:
    """The page, as the code describes the config today."""
    sections = entry_sections()
    names = choices()
    out = [HEADER]
    current = None
    for path, default, description in config_leaves(sections=sections):
        entry = next((s for s in sections if path.startswith(f"{s}.")), None)
        section = entry or path.split(".")[0]
        if section != current:
            current = section
            doc = (sections[entry].__doc__ or "").strip().splitlines()[0] if entry else ""
            out.append(f"\n## `{section}`\n")
            if doc:
                out.append(f"{doc}\n")
            out.append("| leaf | default | what it does |\n|---|---|---|")
        extra = f" Choices: {', '.join(names[path])}." if path in names else ""
        text = f"{description}{extra}".replace("|", "\\|")
        out.append(f"| `{path}` | `{_value(default)}` | {text} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        stale = not DOCS_FILE.is_file() or DOCS_FILE.read_text() != text
        if stale:
            print(f"{DOCS_FILE} is stale: run python -m relay_rl.services.config_reference", file=sys.stderr)
        return 1 if stale else 0
    DOCS_FILE.parent.mkdir(parents=True, exist_ok=True)
    DOCS_FILE.write_text(text)
    print(f"wrote {DOCS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
