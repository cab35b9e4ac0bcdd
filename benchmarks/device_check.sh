#!/usr/bin/env bash
# The accelerator check, one script, under 10 minutes: on a host with a CUDA GPU or an Ascend NPU it
# runs the device-marked tests there (learner and ring buffer on the device, AMP with and without
# GradScaler, the compiled update, relay verify --device, serving, data-parallel learners when
# there are two devices) and prints benchmarks/device_report.py's numbers (the last: a one-minute
# soak of the learner's device memory, flat after warm-up). On a plain CPU machine
# it runs the same on the CPU and says what it skipped.
#
#   bash benchmarks/device_check.sh [--quick] [--only 6] [--e2e-s 90]   # PYTHON=... to pick the interpreter
#
# --only N[,N...] runs only those report sections (no device tests): `--only 6` is the language
# section alone (GRPO on a Qwen2.5-0.5B-shaped model, TRL beside it), a few minutes of its own;
# `--only 2` the fleet end to end (two runs of --e2e-s seconds, 90 by default, and their starts).
#
# What it needs: the project's own packages come from this folder (PYTHONPATH); Python packages the
# host lacks are installed from wheels in .whl/, .whl-llm/ and .whl-arrow/ (made on a machine with
# an index: `bash benchmarks/device_wheels.sh 3.12 env|llm|arrow`, one set per call to a device
# machine), else from the package index if one answers, else the parts needing them are skipped.
# Ray and EnvPool (section 2) come as the pieces .whl-fleet-1/ and .whl-fleet-2/ (`... 3.12
# fleet`): one call carries each, and the call that finds both unpacks them.
# Its log is also written to $OUT/device_check.log when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
QUICK=()
ONLY=()
E2E=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) QUICK=(--quick); shift ;;
        --only) ONLY=(--only "${2:?--only takes section numbers, e.g. 6 or 1,6}"); shift 2 ;;
        --e2e-s) E2E=(--e2e-s "${2:?--e2e-s takes seconds}"); shift 2 ;;
        *) echo "device_check: unknown argument $1 (--quick, --only N[,N], --e2e-s S)" >&2; exit 2 ;;
    esac
done
LOG="${OUT:-$(mktemp -d)}/device_check.log"
exec > >(tee "$LOG") 2>&1
START=$SECONDS
say() { echo "device_check [$((SECONDS - START))s]: $*"; }

shopt -s nullglob  # a set not carried is no wheel, not a literal pattern
WHEELS=(.whl/*.whl .whl-llm/*.whl .whl-arrow/*.whl)
FLEET=(.whl-fleet-[0-9]*/)
shopt -u nullglob
# The fleet set (Ray, EnvPool) travels as pieces, one call each to the same warm machine; once all
# are here they are checked and unpacked (a later call finds the tree already there).
if [[ ${#FLEET[@]} -gt 0 ]]; then
    if "$PY" benchmarks/device_pieces.py unpack .whl-fleet --target /tmp/relay-site-fleet; then
        export PYTHONPATH="/tmp/relay-site-fleet${PYTHONPATH:+:$PYTHONPATH}"
    else
        say "the fleet set cannot be used here (above): the sections run without it"
    fi
fi
if [[ ${#WHEELS[@]} -gt 0 ]]; then
    say "installing ${#WHEELS[@]} carried wheels into /tmp/relay-site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/relay-site "${WHEELS[@]}" && export PYTHONPATH="/tmp/relay-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# The packages relay cannot import without (the rest are per section, reported there).
NEEDED=$("$PY" - <<'PYEOF'
import importlib.util
need = {"torch": "torch", "numpy": "numpy", "gymnasium": "gymnasium", "pydantic": "pydantic",
        "yaml": "pyyaml", "pytest": "pytest", "hypothesis": "hypothesis"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PYEOF
)
if [[ -n "$NEEDED" ]]; then
    say "missing: $NEEDED; trying the package index (60 s at most)"
    timeout 60 "$PY" -m pip install -q $NEEDED || { say "could not install $NEEDED: stopping"; exit 2; }
fi

DEVICE=$("$PY" -c "from relay_rl.learner.device import check_device; print(check_device('auto').type)") || exit 2
say "device: $DEVICE"
[[ "$DEVICE" == "cpu" ]] && say "no accelerator here: everything below runs on the CPU (cuda/npu parts are skipped)"

TESTS=0
if [[ ${#ONLY[@]} -eq 0 ]]; then
    say "device-marked tests on $DEVICE"
    RELAY_TEST_DEVICE="$DEVICE" timeout 240 "$PY" -m pytest -q -m device tests/device -p no:cacheprovider -rs
    TESTS=$?
    say "device tests: exit $TESTS"
fi

say "device report"
timeout $((570 - (SECONDS - START))) "$PY" benchmarks/device_report.py --device "$DEVICE" "${QUICK[@]}" "${ONLY[@]}" "${E2E[@]}"
REPORT=$?
say "report: exit $REPORT; log: $LOG"
exit $((TESTS != 0 || REPORT != 0))
