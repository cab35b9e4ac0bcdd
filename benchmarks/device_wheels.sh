#!/usr/bin/env bash
# Wheels for benchmarks/device_check.sh on a device host that reaches no package index (the lent
# GPU machines here: Python 3.12, torch preinstalled, no gymnasium, pydantic, MuJoCo or ale-py).
# Run it where pip reaches an index; it fills .whl/ (ignored by git), which travels with the tree.
#
#   bash benchmarks/device_wheels.sh [PYTHON_VERSION]      # default 3.12
#
# Ray is left out: its wheel alone is larger than what may travel (64 MiB), so the report's
# end-to-end section says it skipped where Ray is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYV="${1:-3.12}"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
PACKAGES=(
    gymnasium farama-notifications pydantic pydantic-core annotated-types typing-inspection
    mujoco mujoco-core mujoco-studio glfw pyopengl ale-py
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "${PACKAGES[@]}"
du -sh .whl
