#!/usr/bin/env bash
# End-to-end run on a local kind cluster with simulated GPUs (the kubelet plugin's mock backend):
# builds the image, creates the cluster, installs the chart, applies every example and checks that
# each pod received its GPU or GPU share through CDI (the SHAREGPU_* variables the plugin injects).
#
# Needs docker (or podman with CONTAINER_ENGINE=podman), kind, kubectl and helm on PATH. Runs from
# any directory. Settings (environment):
#   CLUSTER_NAME     kind cluster name                 (default: sharegpu)
#   KIND_NODE_IMAGE  node image, Kubernetes 1.34+      (default: kindest/node:v1.34.0)
#   IMAGE            image to build and load           (default: sharegpu:dev)
#   EXAMPLE_IMAGE    small image substituted for the CUDA/PyTorch images of the examples, since
#                    there is no GPU in kind           (default: busybox:1.37)
#   KEEP_CLUSTER=1   keep the cluster afterwards (default: delete it when the run succeeds)
#
# There is no GPU, so the examples' nvidia-smi / PyTorch commands fail inside the pods; what is
# checked is that each pod was scheduled with an allocated claim and that its container saw the
# share variables of the prepared claim.
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
cluster="${CLUSTER_NAME:-sharegpu}"
node_image="${KIND_NODE_IMAGE:-kindest/node:v1.34.0}"
image="${IMAGE:-sharegpu:dev}"
example_image="${EXAMPLE_IMAGE:-busybox:1.37}"
engine="${CONTAINER_ENGINE:-docker}"
namespace=sharegpu-system
examples_ns=sharegpu-examples

log() { printf '\n== %s\n' "$*"; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "run.sh: $1 is not installed" >&2; exit 1; }; }
for tool in "$engine" kind kubectl helm; do need "$tool"; done
if [ "$engine" = podman ]; then
  export KIND_EXPERIMENTAL_PROVIDER=podman
  # podman names local images localhost/<name>; the pods must ask for that name.
  case "$image" in */*) ;; *) image="localhost/$image" ;; esac
fi

log "building $image"
"$engine" build -f "$repo/deploy/Dockerfile" -t "$image" "$repo"

if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  log "creating kind cluster $cluster ($node_image)"
  kind create cluster --name "$cluster" --image "$node_image" --config "$repo/deploy/kind/cluster.yaml"
fi
if [ "$engine" = podman ]; then
  archive="$(mktemp --suffix=.tar)"
  podman save -o "$archive" "$image"
  kind load image-archive "$archive" --name "$cluster"
  rm -f "$archive"
else
  kind load docker-image "$image" --name "$cluster"
fi
kubectl config use-context "kind-$cluster" >/dev/null

install_chart() {  # $1: sharing mode; further arguments go to helm
  local mode="$1"
  shift
  log "installing the chart (mock backend, sharing mode $mode)"
  kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f -
  # The plugin pod is privileged: allow it in this namespace only.
  kubectl label namespace "$namespace" --overwrite pod-security.kubernetes.io/enforce=privileged
  helm upgrade --install sharegpu "$repo/deploy/helm/sharegpu" --namespace "$namespace" \
    --set image.repository="${image%:*}" --set image.tag="${image##*:}" \
    --set image.pullPolicy=Never \
    --set kubeletPlugin.deviceBackend=mock --set kubeletPlugin.mock.gpus=4 \
    --set kubeletPlugin.sharingMode="$mode" \
    --set deviceClasses.extendedResource.enabled=true \
    --set logging.format=text "$@" --wait --timeout 5m
  kubectl -n "$namespace" rollout status daemonset -l app.kubernetes.io/component=kubelet-plugin --timeout=3m
  log "waiting for the mock GPUs to be published"
  for _ in $(seq 60); do
    if [ "$(kubectl get resourceslices --field-selector spec.driver=gpu.sharegpu.dev -o name | wc -l)" -ge 2 ]; then
      break
    fi
    sleep 2
  done
  kubectl get resourceslices --field-selector spec.driver=gpu.sharegpu.dev
}

# Applies one example with the small image and waits until every pod printed its share.
run_example() {  # $1: example directory name
  local dir="$repo/examples/$1" pods pod
  log "example $1"
  sed -E "s#^( *image: ).*#\1$example_image#; s#sleep infinity#sleep 3600#" "$dir"/*.yaml \
    | kubectl apply -n "$examples_ns" -f -
  for _ in $(seq 90); do
    pods="$(kubectl get pods -n "$examples_ns" -o name)"
    local done_count=0 total=0
    for pod in $pods; do
      total=$((total + 1))
      if kubectl logs -n "$examples_ns" "$pod" 2>/dev/null | grep -q '^SHAREGPU_CLAIM_UID='; then
        done_count=$((done_count + 1))
      fi
    done
    if [ "$total" -gt 0 ] && [ "$done_count" -eq "$total" ]; then
      for pod in $pods; do
        echo "--- $pod"
        kubectl logs -n "$examples_ns" "$pod" | grep -E '^(NVIDIA_VISIBLE_DEVICES|SHAREGPU_|CUDA_MPS_)'
      done
      kubectl get resourceclaims -n "$examples_ns"
      sed -E "s#^( *image: ).*#\1$example_image#" "$dir"/*.yaml \
        | kubectl delete -n "$examples_ns" --cascade=foreground --wait=true -f - >/dev/null
      return 0
    fi
    sleep 2
  done
  echo "run.sh: example $1: not every pod received a prepared claim within 180 s" >&2
  kubectl get pods,resourceclaims -n "$examples_ns" -o wide >&2
  kubectl describe pods -n "$examples_ns" >&2
  exit 1
}

install_chart consumable
kubectl create namespace "$examples_ns" --dry-run=client -o yaml | kubectl apply -f -
for example in whole-gpu select-by-model-and-memory two-pods-fractional-share mps-with-overrides \
  burstable-shares \
  time-slicing multi-gpu-same-pcie-root first-available device-plugin-style vllm-inference \
  training-job multi-gpu-nvlink; do
  run_example "$example"
done
kubectl get gpus -o wide
# gpu-and-nic-same-pcie-root also needs a second DRA driver that publishes RDMA NICs on the node
# (kind has none); tests/e2e/test_topology.py runs it beside a test NIC driver.
log "example gpu-and-nic-same-pcie-root needs a NIC driver: not run here"

install_chart partitions
run_example partitions
# Its quarter-GPU class selects partition devices, which only partitions mode publishes.
run_example admin-device-classes
kubectl get gpus -o wide

# Mock GPU 0 in MIG mode with two 1g.10gb and one 3g.40gb MIG device, next to a whole GPU 1.
mig_gpus="$(mktemp --suffix=.yaml)"
cat > "$mig_gpus" <<'YAML'
- migDevices:
    - {profile: 1g.10gb, gpuInstance: 9}
    - {profile: 1g.10gb, gpuInstance: 10}
    - {profile: 3g.40gb, gpuInstance: 2}
- {}
YAML
install_chart consumable --set-file kubeletPlugin.mock.config="$mig_gpus"
run_example mig-static
rm -f "$mig_gpus"

# mig-dynamic: partitions mode with --mig dynamic; the mock GPUs are in MIG mode and the plugin
# creates each MIG instance when its pod's claim is prepared (in its data directory's mock file).
install_chart partitions --set kubeletPlugin.mig=dynamic --set-string kubeletPlugin.mock.config=
run_example mig-dynamic

# gpu-quota creates claims, no pods: the second claim must be denied by the quota.
log "example gpu-quota"
kubectl apply -f "$repo/examples/gpu-quota/gpu-quota.yaml"
if ! kubectl apply -f "$repo/examples/gpu-quota/quota-claims.yaml" 2>&1 | grep -q 'exceeded GpuQuota'; then
  echo "run.sh: example gpu-quota: the claim over the quota was not denied" >&2
  exit 1
fi
kubectl get gpuquotas -A
kubectl delete -f "$repo/examples/gpu-quota/quota-claims.yaml" --ignore-not-found
kubectl delete -f "$repo/examples/gpu-quota/gpu-quota.yaml"

log "all examples ran"
if [ "${KEEP_CLUSTER:-0}" != 1 ]; then kind delete cluster --name "$cluster"; fi
