#!/usr/bin/env bash
# Creates .bench/trl-venv with the exact versions the reference benchmark was measured with.
# torch goes first: the local CPU wheel, not a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .bench/trl-venv
.bench/trl-venv/bin/pip install -q torch==2.13.0
.bench/trl-venv/bin/pip install -q -r ../shared/bench/requirements.txt
