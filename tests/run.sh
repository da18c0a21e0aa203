#!/usr/bin/env bash
# The test command (README, .ci/run): a new virtualenv with today's versions of every dependency, then the suite.
#
#   bash tests/run.sh                 # the default tier (every test not marked slow)
#   bash tests/run.sh --all           # then the slow tier (soak and load tests, the demo in a browser (required),
#                                     # whole-suite smoke runs, end-to-end runs in new processes): what CI runs
#   bash tests/run.sh tests/core -x   # arguments go to pytest (-n 0: one process)
#
# Nothing that the machine already has can hide a break: the virtualenv (.venv-test, or $MMSPEC_TEST_VENV) is created
# anew with --clear, mmspec and its test extra are installed there at the newest versions pyproject.toml's bounds allow
# (torch pinned to the local CPU build, so that pip never pulls CUDA wheels), and pytest runs with that interpreter.
# Debian's chromium is installed for the demo's browser tests (Playwright drives it; no browser is downloaded).
# After one run, `.venv-test/bin/python -m pytest ...` reruns tests without reinstalling.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${MMSPEC_TEST_VENV:-.venv-test}"
tiers=("not slow")
if [ "${1:-}" = "--all" ]; then
    tiers=("not slow" "slow")
    shift
fi
start=$(date +%s)

if ! command -v chromium > /dev/null; then
    sudo=$([ "$(id -u)" = 0 ] || echo sudo)
    $sudo apt-get install -y -q chromium > /dev/null || { $sudo apt-get update -q && $sudo apt-get install -y -q chromium; }
fi

echo "creating $venv and installing mmspec[test] (under a minute with pip's cache, a few minutes downloading)"
python3 -m venv --clear "$venv"
"$venv/bin/python" -m pip install -qq --upgrade pip
# --no-compile: compiling every installed module (torch's thousands) takes longer than compiling, on first import, the
# ones the tests import; bytecode is then written as they import (whatever PYTHONDONTWRITEBYTECODE said)
"$venv/bin/python" -m pip install -qq --no-compile "torch==2.13.0" -e ".[test]"
unset PYTHONDONTWRITEBYTECODE
echo "installed in $(( $(date +%s) - start )) s"

"$venv/bin/python" - <<'EOF'
import importlib.metadata as metadata
import platform
import shutil
import subprocess

packages = ("torch", "diffusers", "transformers", "tokenizers", "huggingface_hub", "safetensors", "numpy", "pillow",
            "gradio", "gradio_client", "torchmetrics", "accelerate", "scipy", "matplotlib", "imageio", "playwright", "ftfy",
            "ray", "fastapi", "openai",
            "pytest", "setuptools", "pip")
versions = [f"python {platform.python_version()}"] + [f"{name} {metadata.version(name)}" for name in packages]
chromium = shutil.which("chromium")
if chromium:
    versions.append(subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout.strip())
print("resolved versions: " + ", ".join(versions), flush=True)
EOF

# Two workers, one file each at a time (a module's fixtures, e.g. the demo server, stay in one process): on 2 cores
# one runs while the other waits on a subprocess or a server. The 15 slowest tests of each tier are listed for its
# time budget (the default tier: under 10 minutes on 2 cores).
for tier in "${tiers[@]}"; do
    echo "the ${tier/not slow/default} tier"
    tier_start=$(date +%s)
    status=0
    MMSPEC_REQUIRE_BROWSER=1 "$venv/bin/python" -m pytest -q -n 2 --dist loadfile --durations=15 -m "$tier" "$@" \
        || status=$?
    [ "$status" = 0 ] || [ "$status" = 5 ] || exit "$status"  # 5: the arguments chose no test of this tier
    echo "the ${tier/not slow/default} tier took $(( $(date +%s) - tier_start )) s"
done
