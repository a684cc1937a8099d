#!/usr/bin/env bash
# Builds the real Kubernetes components and simulators the e2e harness runs, from pinned Go modules,
# into a cache outside the repo (one folder per component@version). A warm run only checks the cache.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
CACHE=${V41F_CACHE:-$HOME/.cache/v41flash}
BIN=$CACHE/bin
mkdir -p "$BIN" "$CACHE/build"
export CGO_ENABLED=0 GOWORK=off GOTOOLCHAIN=local GOFLAGS=-mod=mod
export GOPATH=${GOPATH:-$CACHE/gopath} GOCACHE=${GOCACHE:-$CACHE/gocache}

log() { printf '[build-tools %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# have NAME VERSION: true when every listed binary of that component@version is cached.
have() { local d="$BIN/$1-$2"; shift 2; for b in "$@"; do [ -x "$d/$b" ] || return 1; done; }

# wrapper DIR: a fresh throwaway module to build a main package in.
wrapper() { rm -rf "$1"; mkdir -p "$1"; (cd "$1" && go mod init v41flash.local/build >/dev/null 2>&1); }

build_simple() { # NAME VERSION MODULE PKG BINNAME
  local name=$1 ver=$2 mod=$3 pkg=$4 bin=$5 out="$BIN/$1-$2"
  if have "$name" "$ver" "$bin"; then log "$name $ver cached"; return; fi
  log "building $name $ver ($pkg)"
  local w="$CACHE/build/$name"; wrapper "$w"
  (cd "$w" && go get "$pkg@$ver" && mkdir -p "$out.tmp" && go build -trimpath -o "$out.tmp/$bin" "$pkg")
  rm -rf "$out"; mv "$out.tmp" "$out"; log "$name $ver done"
}

build_kubernetes() {
  local ver=$KUBERNETES_VERSION out="$BIN/kubernetes-$KUBERNETES_VERSION"
  if have kubernetes "$ver" kube-apiserver kube-controller-manager kube-scheduler; then log "kubernetes $ver cached"; return; fi
  log "building kubernetes $ver (apiserver, controller-manager, scheduler; 20-40 min cold on 2 cores)"
  local w="$CACHE/build/kubernetes"; wrapper "$w"
  local staging="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
    cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api cri-client
    cri-streaming csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
    kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission
    sample-apiserver sample-cli-plugin sample-controller streaming"
  local sver="v0.${ver#v1.}"
  (
    cd "$w"
    for m in $staging; do go mod edit "-replace=k8s.io/$m=k8s.io/$m@$sver"; done
    go get "k8s.io/kubernetes/cmd/kube-apiserver@$ver" "k8s.io/kubernetes/cmd/kube-controller-manager@$ver" \
      "k8s.io/kubernetes/cmd/kube-scheduler@$ver"
    local major=${ver#v}; major=${major%%.*}; local minor=${ver#v*.}; minor=${minor%%.*}
    local ld=""
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld="$ld -X $p.gitVersion=$ver -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    done
    mkdir -p "$out.tmp"
    go build -trimpath -ldflags "-s -w $ld" -o "$out.tmp/" k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
  )
  rm -rf "$out"; mv "$out.tmp" "$out"; log "kubernetes $ver done"
}

want=${*:-etcd kwok inference-sim helm lws kubernetes}
for c in $want; do
  case $c in
    etcd) build_simple etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3 etcd ;;
    kwok) build_simple kwok "$KWOK_VERSION" sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok kwok ;;
    inference-sim) build_simple inference-sim "$INFERENCE_SIM_VERSION" github.com/llm-d/llm-d-inference-sim \
                     github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim llm-d-inference-sim ;;
    helm) build_simple helm "$HELM_VERSION" helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm helm ;;
    lws) build_simple lws "$LWS_VERSION" sigs.k8s.io/lws sigs.k8s.io/lws/cmd lws ;;
    kubernetes) build_kubernetes ;;
    *) echo "unknown component $c" >&2; exit 2 ;;
  esac
done
log "all tools in $BIN"
