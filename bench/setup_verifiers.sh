#!/usr/bin/env bash
# Creates .bench/vf-venv: ScaleRL with its serve extra and verifiers 0.4.0, for bench/verifiers_endpoint.py.
# A venv of its own: verifiers pins openai<3 and mcp==2.0.0, which would replace the main venv's newer openai.
# torch goes first: the local CPU wheel, not a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .bench/vf-venv
.bench/vf-venv/bin/pip install -q torch==2.13.0
.bench/vf-venv/bin/pip install -q -e '.[serve]'
.bench/vf-venv/bin/pip install -q verifiers==0.4.0
.bench/vf-venv/bin/python -c "import verifiers, openai; print('verifiers', verifiers.__version__, 'openai', openai.__version__)"
