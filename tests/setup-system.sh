#!/usr/bin/env bash
# System packages the test suite uses where it can: podman (a real CDI consumer) and helm.
# Best effort: a test that needs a missing tool skips with a clear reason.
set -u
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  if ! command -v podman >/dev/null 2>&1 || ! command -v busybox >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      podman runc busybox-static >/dev/null) || echo "setup-system: podman could not be installed; podman tests will skip"
  fi
fi
bash "$(dirname "$0")/install-helm.sh"
exit 0
