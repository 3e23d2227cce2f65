#!/usr/bin/env bash
# Builds the upstream binaries the end-to-end tests run (Kubernetes and etcd) from the Go modules
# pinned under tests/e2e/upstream/, into a cache outside the checkout:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/sharegpu-e2e/<kubernetes version>-<hash of the pins>/bin
# A binary already there is reused, so a second run (or a fresh clone on the same machine) takes
# seconds. The Go build and module caches live under the same cache directory.
#
# Usage: build-binaries.sh [--print-dir] [binary...]
#   binary: etcd kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy
#           containerd test-driver
#           (default: $SHAREGPU_E2E_BINARIES, else the control-plane set below; containerd
#           builds containerd, containerd-shim-runc-v2 and ctr; test-driver builds upstream's DRA
#           test driver, k8s.io/kubernetes/test/e2e/dra/test-driver, the Go peer of the
#           benchmarks, alone: its pins are upstream/test-driver/ and its cache directory is
#           <cache>/test-driver-<kubernetes version>-<hash of its pins>/bin, so that it never
#           changes the cluster binaries' key)
#   --print-dir: print the bin directory and exit without building (with test-driver: its own).
# The releases are named in api/upstream.toml (kubernetes, kubernetes-previous, etcd, containerd);
# the script refuses to run when a go.mod under upstream/ requires another one.
# SHAREGPU_E2E_K8S=<kubernetes-previous> builds the second pinned Kubernetes release
# (upstream/kubernetes-<its minor>/); unset, or the kubernetes version, builds the default one.
# The last line on stdout is the bin directory. Build times are appended to <dir>/build-times.log.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
pins="$here/upstream"
default_binaries="etcd kube-apiserver kubectl kube-controller-manager kube-scheduler"

die() { echo "build-binaries: $*" >&2; exit 1; }

print_only=0
binaries=()
for arg in "$@"; do
  case "$arg" in
    --print-dir) print_only=1 ;;
    etcd|kube-apiserver|kubectl|kube-controller-manager|kube-scheduler|kubelet|kube-proxy|containerd|test-driver) binaries+=("$arg") ;;
    *) die "unknown argument '$arg' (allowed: --print-dir, etcd, kube-apiserver, kubectl, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, containerd, test-driver)" ;;
  esac
done
if [ "${#binaries[@]}" = 0 ]; then
  read -r -a binaries <<< "${SHAREGPU_E2E_BINARIES:-$default_binaries}"
fi

pinned_version() { awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == "k8s.io/kubernetes" {print $3; exit}' "$1/go.mod"; }
# The version of `key = "X.Y.Z"` in api/upstream.toml, with a v.
pin_file="$here/../../api/upstream.toml"
pin() {
  local value
  value="$(awk -F'"' -v key="$1" '$1 ~ "^" key " *= *$" {print $2; exit}' "$pin_file")"
  [ -n "$value" ] || die "$pin_file: no $1 = \"X.Y.Z\" line"
  echo "v$value"
}
# Dies unless the go.mod of directory $1 requires module $2 at version $3.
require_pin() {
  awk -v m="$2" -v v="$3" '($1 == m && $2 == v) || ($1 == "require" && $2 == m && $3 == v) {found=1} END {exit !found}' "$1/go.mod" \
    || die "${1#"$here"/}/go.mod does not require $2 $3, the release api/upstream.toml names (see docs/development.md, \"Moving to a new Kubernetes release\")"
}

release="$(pin kubernetes)"
previous="$(pin kubernetes-previous)"
require_pin "$pins/kubernetes" k8s.io/kubernetes "$release"
require_pin "$pins/kubernetes-$(echo "${previous#v}" | cut -d. -f1,2)" k8s.io/kubernetes "$previous"
require_pin "$pins/test-driver" k8s.io/kubernetes "$release"
require_pin "$pins/etcd" go.etcd.io/etcd/server/v3 "$(pin etcd)"
require_pin "$pins/containerd" github.com/containerd/containerd/v2 "$(pin containerd)"

# SHAREGPU_E2E_K8S (make e2e K8S=<kubernetes-previous>) picks the second pinned release.
kpins="$pins/kubernetes"
if [ -n "${SHAREGPU_E2E_K8S:-}" ] && [ "v${SHAREGPU_E2E_K8S#v}" != "$release" ]; then
  [ "v${SHAREGPU_E2E_K8S#v}" = "$previous" ] \
    || die "Kubernetes v${SHAREGPU_E2E_K8S#v} is not pinned (pinned: $release $previous)"
  kpins="$pins/kubernetes-$(echo "${previous#v}" | cut -d. -f1,2)"
fi
k8s_version="$(pinned_version "$kpins")"
pin_hash="$(cat "$kpins"/go.{mod,sum} "$pins"/{etcd,containerd}/go.{mod,sum} | sha256sum | cut -c1-12)"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/sharegpu-e2e"
out="$cache_root/$k8s_version-$pin_hash"
# The test driver is built alone, from its own pins, into its own cache directory.
if [[ " ${binaries[*]} " == *" test-driver "* ]]; then
  [ "${#binaries[@]}" = 1 ] || die "test-driver is built alone (its cache directory is its own)"
  tpins="$pins/test-driver"
  [ "$(pinned_version "$tpins")" = "$k8s_version" ] \
    || die "the test driver is pinned at $(pinned_version "$tpins"), not $k8s_version"
  out="$cache_root/test-driver-$k8s_version-$(cat "$tpins"/go.{mod,sum} | sha256sum | cut -c1-12)"
fi
bin="$out/bin"

if [ "$print_only" = 1 ]; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH (go is needed to build the upstream binaries)"
mkdir -p "$bin"

# One build at a time per cache directory: a second caller waits, then finds the binaries built.
exec 9>"$out/.lock"
if ! flock -n 9; then
  echo "build-binaries: another build of $k8s_version holds $out/.lock; waiting for it" >&2
  flock 9
fi

export GOMODCACHE="$cache_root/gomod" GOCACHE="$cache_root/gocache"
export GOFLAGS="-trimpath -buildvcs=false -mod=readonly" GOTOOLCHAIN=local CGO_ENABLED=0
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"

# The version fields Kubernetes' own release build stamps in (hack/lib/version.sh).
minor="${k8s_version#v*.}"; minor="${minor%%.*}"
major="${k8s_version#v}"; major="${major%%.*}"
version_ldflags=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  version_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  version_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# Seconds between two "still building" lines (SHAREGPU_E2E_PROGRESS_S, default 30).
progress_s="${SHAREGPU_E2E_PROGRESS_S:-30}"
case "$progress_s" in ''|*[!0-9]*|0) die "SHAREGPU_E2E_PROGRESS_S must be a positive number of seconds, not '$progress_s'" ;; esac

build_one() {
  local name="$1" dir pkgs ldflags="-s -w" tags=""
  case "$name" in
    etcd) dir="$pins/etcd"; pkgs=(go.etcd.io/etcd/server/v3) ;;
    containerd)
      # Static, without the snapshotters that need C libraries (btrfs, devmapper, zfs).
      dir="$pins/containerd"; tags="no_btrfs no_devmapper no_zfs urfave_cli_no_docs"
      pkgs=(github.com/containerd/containerd/v2/cmd/{containerd,containerd-shim-runc-v2,ctr}) ;;
    test-driver)
      dir="$tpins"; pkgs=(k8s.io/kubernetes/test/e2e/dra/test-driver); ldflags+="$version_ldflags" ;;
    *) dir="$kpins"; pkgs=("k8s.io/kubernetes/cmd/$name"); ldflags+="$version_ldflags" ;;
  esac
  local start=$SECONDS tmp="$out/build-$name"
  echo "build-binaries: building $name (${pkgs[*]}) ..." >&2
  rm -rf "$tmp" && mkdir -p "$tmp"
  local target="$tmp/"
  [ "${#pkgs[@]}" = 1 ] && target="$tmp/$name"
  (cd "$dir" && exec nice -n 10 go build -tags "$tags" -ldflags "$ldflags" -o "$target" "${pkgs[@]}") &
  local pid=$! ticks=0
  # A cold kube-apiserver takes minutes: say every $progress_s seconds that the build goes on.
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    ticks=$((ticks + 1))
    if [ $((ticks % progress_s)) = 0 ] && kill -0 "$pid" 2>/dev/null; then
      echo "build-binaries: still building $name ($((SECONDS - start)) s)" >&2
    fi
  done
  wait "$pid" || die "building $name failed (command: cd $dir && go build -o $target ${pkgs[*]})"
  # The binary named like the target goes last: its presence means the whole target is built.
  find "$tmp" -maxdepth 1 -type f ! -name "$name" -exec mv {} "$bin/" \;
  mv "$tmp/$name" "$bin/$name"
  rmdir "$tmp"
  local took=$((SECONDS - start))
  echo "build-binaries: built $name in ${took}s" >&2
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $name ${took}s nproc=$(nproc)" >> "$out/build-times.log"
}

for name in "${binaries[@]}"; do
  if [ -x "$bin/$name" ]; then
    echo "build-binaries: $name cached" >&2
  else
    build_one "$name"
  fi
done
echo "$bin"
