#!/usr/bin/env bash
# Issues 13 and 38's device check as one prepared run ("If this issue is lent the device"): each precision mode's peak
# GPU memory (torch.cuda.max_memory_allocated), step time and generated tokens/s on a ~0.5B random-init Llama,
# plus optim.offload, torchao float8 (aggressive) and flash_attention_2 where they load.
#
#   bash bench/gpu_check.sh fetch   # here: the wheels the device image lacks (pydantic, math-verify, bitsandbytes,
#                                   # torchao; ~50 MB) into .whl/ (git-ignored), for Python 3.12 on x86-64
#   device run, carry [".whl"], timeout_s 600, command: bash bench/gpu_check.sh run
#
# `run` installs the wheels into /tmp/site, puts the checkout on PYTHONPATH (nothing is pip-installed there),
# prints the GPU and versions, runs bench/precision_modes.py --device cuda --size 0.5b and copies its results to
# $OUT, then bench/static_decode.py --device cuda --compiled (the HF engine's decode: model forward, static KV cache,
# CUDA-graph replay) and bench/chunked_logprobs.py --device cuda (peak GPU memory with and without the chunked head). A mode that cannot load there (say torchao against that torch) is listed as failed; the others still run.
# Written and run on CPU up to the CUDA calls (`--device cuda` there lists every mode as failed); never run on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
fetch)
    rm -rf .whl && mkdir .whl
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl \
        pydantic pydantic-core annotated-types typing-inspection math-verify latex2sympy2_extended \
        antlr4-python3-runtime==4.13.2 torchao==0.18.0 bitsandbytes==0.50.2
    du -sh .whl ;;
run)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    python3 bench/precision_modes.py --device cuda --size 0.5b --steps 3 --new-tokens 256 --save 2>&1 | tee "${OUT:-/tmp}/precision_modes_gpu.log"
    # issue 38: decoding with each rollout.decode (compiled: CUDA graphs) and the chunked LM head's peak memory on the GPU
    python3 bench/static_decode.py --device cuda --rounds 5 --compiled --save 2>&1 | tee "${OUT:-/tmp}/static_decode_gpu.log" || true
    python3 bench/chunked_logprobs.py --device cuda --save 2>&1 | tee "${OUT:-/tmp}/chunked_logprobs_gpu.log" || true
    cp bench/results/precision_modes_gpu_* bench/results/static_decode_gpu_* bench/results/chunked_logprobs_gpu_* "${OUT:-/tmp}/" 2>/dev/null || true ;;
*)
    echo "usage: bash bench/gpu_check.sh fetch|run" >&2; exit 2 ;;
esac
