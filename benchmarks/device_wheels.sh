#!/usr/bin/env bash
# Wheels for benchmarks/device_check.sh on a device host that reaches no package index (the lent
# GPU machines here: Python 3.12, torch preinstalled, no gymnasium, pydantic, MuJoCo or ale-py).
# Run it where pip reaches an index; it fills an ignored folder that travels with the tree.
#
#   bash benchmarks/device_wheels.sh [PYTHON_VERSION] [env|llm|arrow]   # default 3.12 env
#
# Each set fits under what one call to the device machine may carry (64 MiB with the tree), and a
# warm machine keeps ignored paths between calls, so the sets can travel one call at a time:
#   env   -> .whl/        gymnasium, pydantic, MuJoCo, ale-py (the env sections; 30 MB)
#   llm   -> .whl-llm/    transformers, tokenizers, safetensors, TRL, datasets, accelerate, pandas
#                         and what they import (the language section; 47 MB)
#   arrow -> .whl-arrow/  pyarrow alone (53 MB), which datasets, so TRL, cannot import without
# Ray is left out: its wheel alone is larger than what may travel, so the report's end-to-end
# section says it skipped where Ray is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYV="${1:-3.12}"
SET="${2:-env}"
case "$SET" in
    env)
        DIR=.whl
        PACKAGES=(
            gymnasium farama-notifications pydantic pydantic-core annotated-types typing-inspection
            mujoco mujoco-core mujoco-studio glfw pyopengl ale-py
        ) ;;
    llm)
        DIR=.whl-llm
        # transformers 5's own imports (huggingface-hub's CLI and HTTP stack included); torch,
        # numpy, filelock, fsspec, jinja2 and typing-extensions come with the host's torch.
        PACKAGES=(
            transformers tokenizers safetensors huggingface-hub hf-xet httpx2 httpcore2 anyio h11 idna
            click typer shellingham rich markdown-it-py mdurl pygments kernels tomlkit truststore
            regex tqdm pyyaml packaging pydantic pydantic-core annotated-types annotated-doc
            typing-inspection
            trl datasets accelerate pandas python-dateutil six dill multiprocess xxhash psutil
        ) ;;
    arrow)
        DIR=.whl-arrow
        PACKAGES=(pyarrow) ;;
    *)
        echo "device_wheels: the set is env, llm or arrow (got $SET)" >&2
        exit 2 ;;
esac
grep -qx "/$DIR/" .git/info/exclude 2>/dev/null || echo "/$DIR/" >> .git/info/exclude
mkdir -p "$DIR"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$DIR" "${PACKAGES[@]}"
du -sh "$DIR"
