#!/usr/bin/env bash
# Build the real cluster's binaries from the Go module proxy, pinned by versions.env, into a
# cache keyed by version. Idempotent: a component whose stamp file exists is skipped.
#   kubernetes-<v>/bin: kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl
#   etcd-<v>/bin: etcd
#   helm-<v>/bin: helm
#   coredns-<v>/bin: coredns (the cluster's DNS, as every conformant cluster has)
#   kwok-<v>/bin: kwok (plays the kubelet of fake nodes: the e2e fleet of 200 pods), and
#   kwok-<v>/stages.yaml: the Stages kwokctl gives it by default (kwok alone starts with none)
# k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces its staging modules by path),
# so it is built from a throw-away wrapper module that requires it and replaces every staging
# module with its published twin k8s.io/X v0.<minor>.<patch>, derived from k8s.io/kubernetes's
# own go.mod (never a hand-kept list). Static (CGO off), trimmed, version-stamped so /version
# tells the truth (helm's kubeVersion checks read it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${SLOGATE_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slogate/kube}
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
mkdir -p "$cache"

log() { printf '[kube-build %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

wrapper() {  # wrapper DIR: a fresh module with no code of its own
  rm -rf "$1"; mkdir -p "$1"; (cd "$1" && go mod init local/wrapper >/dev/null 2>&1)
}

build_kubernetes() {
  local out="$cache/kubernetes-$KUBE_VERSION"
  [ -f "$out/.complete" ] && { log "kubernetes $KUBE_VERSION: cached"; return; }
  local minor=${KUBE_VERSION#*.}; minor=${minor%%.*}
  local staging="v0.${KUBE_VERSION#*.}"
  local w="$cache/.work-kubernetes-$KUBE_VERSION"
  log "kubernetes $KUBE_VERSION: resolving (staging modules at $staging)"
  wrapper "$w"; cd "$w"
  go mod edit -go=1.25.0 -godebug=default=go1.25
  local kmod
  kmod=$(go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  local replaced=0
  for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$kmod"); do
    go mod edit -replace="$m=$m@$staging"; replaced=$((replaced + 1))
  done
  log "kubernetes $KUBE_VERSION: $replaced staging modules replaced"
  local cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
  local pkgs=()
  for c in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c@v$KUBE_VERSION"); done
  go get "${pkgs[@]}"
  local ld="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=v$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  mkdir -p "$out/bin"
  for c in "${cmds[@]}"; do
    log "kubernetes $KUBE_VERSION: building $c"
    go build -trimpath -tags selinux,notest -ldflags "$ld" -o "$out/bin/$c" "k8s.io/kubernetes/cmd/$c"
  done
  "$out/bin/kube-apiserver" --version
  touch "$out/.complete"; cd /; rm -rf "$w"
}

build_etcd() {
  local out="$cache/etcd-$ETCD_VERSION"
  [ -f "$out/.complete" ] && { log "etcd $ETCD_VERSION: cached"; return; }
  local w="$cache/.work-etcd-$ETCD_VERSION"
  log "etcd $ETCD_VERSION: building"
  wrapper "$w"; cd "$w"
  go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  mkdir -p "$out/bin"
  go build -trimpath -ldflags "-s -w" -o "$out/bin/etcd" go.etcd.io/etcd/server/v3
  "$out/bin/etcd" --version | sed -n 1p
  touch "$out/.complete"; cd /; rm -rf "$w"
}

build_helm() {
  local out="$cache/helm-$HELM_VERSION"
  [ -f "$out/.complete" ] && { log "helm $HELM_VERSION: cached"; return; }
  log "helm $HELM_VERSION: building"
  mkdir -p "$out/bin"
  GOBIN="$out/bin" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION" \
    "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION"
  "$out/bin/helm" version --short
  touch "$out/.complete"
}

build_coredns() {
  local out="$cache/coredns-$COREDNS_VERSION"
  [ -f "$out/.complete" ] && { log "coredns $COREDNS_VERSION: cached"; return; }
  log "coredns $COREDNS_VERSION: building"
  mkdir -p "$out/bin"
  GOBIN="$out/bin" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@v$COREDNS_VERSION"
  "$out/bin/coredns" -version | sed -n 1p
  touch "$out/.complete"
}

build_kwok() {
  # kwok alone refuses to start without Stages ("no stages found"): kwokctl writes its
  # default set into the config. Ours is the same set, read from the module's own
  # kustomize/stage/fast (node-initialize, node-heartbeat-with-lease, pod-ready,
  # pod-complete, pod-delete), never a hand-kept copy.
  local out="$cache/kwok-$KWOK_VERSION"
  [ -f "$out/.complete" ] && { log "kwok $KWOK_VERSION: cached"; return; }
  log "kwok $KWOK_VERSION: building"
  mkdir -p "$out/bin"
  GOBIN="$out/bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
  "$out/bin/kwok" --version
  local dir
  dir=$(cd / && go mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  python3 - "$dir/kustomize/stage/fast" "$out/stages.yaml" <<'PY'
import os, sys
def resources(directory):  # a kustomization's `resources:` list (plain `- name` lines), directories followed
    lines = open(os.path.join(directory, "kustomization.yaml")).read().split("resources:", 1)[1].splitlines()
    for line in lines:
        if not line.startswith("- "):
            if line.strip():
                break
            continue
        path = os.path.normpath(os.path.join(directory, line[2:].strip()))
        yield from resources(path) if os.path.isdir(path) else [path]
files = list(resources(sys.argv[1]))
with open(sys.argv[2], "w") as out:
    out.write("\n---\n".join(open(f).read().strip() for f in files) + "\n")
print(f"{len(files)} stages: " + ", ".join(os.path.basename(f) for f in files))
PY
  cp "$dir/LICENSE" "$out/LICENSE"
  touch "$out/.complete"
}

fetch_keda_crd() {
  # The module's zip from the Go module proxy, as `go mod download` fetches it (that command
  # refuses this module: it asks for a newer Go than this machine's, which reading two
  # files of it does not need); only the CRD and the LICENSE are kept.
  local out="$cache/keda-$KEDA_VERSION"
  [ -f "$out/.complete" ] && { log "keda $KEDA_VERSION CRD: cached"; return; }
  local proxy zip="$cache/.keda-$KEDA_VERSION.zip"
  proxy=$(go env GOPROXY | cut -d, -f1)
  log "keda $KEDA_VERSION CRD: from $proxy"
  curl -fsSL -o "$zip" "$proxy/github.com/kedacore/keda/v2/@v/v$KEDA_VERSION.zip"
  mkdir -p "$out"
  python3 - "$zip" "$out" "github.com/kedacore/keda/v2@v$KEDA_VERSION" <<'PY'
import sys, zipfile
archive, out, root = sys.argv[1:]
with zipfile.ZipFile(archive) as z:
    for inside, name in (("config/crd/bases/keda.sh_scaledobjects.yaml", "keda.sh_scaledobjects.yaml"),
                         ("LICENSE", "LICENSE")):
        with open(f"{out}/{name}", "wb") as target:
            target.write(z.read(f"{root}/{inside}"))
PY
  rm -f "$zip"
  touch "$out/.complete"
}

start=$SECONDS
fetch_keda_crd
build_etcd
build_helm
build_kubernetes
build_coredns
build_kwok
log "done in $((SECONDS - start)) s; binaries under $cache"
