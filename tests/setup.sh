#!/usr/bin/env bash
# Test set-up on a fresh machine: mmspec with its test extra (torch pinned to the local CPU build, so that pip never
# pulls CUDA wheels) and Debian's Chromium for the demo's browser tests (Playwright drives it; no browser download).
set -euo pipefail
cd "$(dirname "$0")/.."
pip install "torch==2.13.0" -e ".[test]"
if ! command -v chromium > /dev/null; then
    sudo=$([ "$(id -u)" = 0 ] || echo sudo)
    $sudo apt-get install -y -q chromium || { $sudo apt-get update -q && $sudo apt-get install -y -q chromium; }
fi
