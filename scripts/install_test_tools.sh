#!/usr/bin/env bash
# Best effort: the Debian packages that two slow tests use (a real Prometheus server scraping a run,
# headless Chromium rendering `scalerl report`). Without them those tests skip themselves with the
# reason; this script never fails the test command.
set -u
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
