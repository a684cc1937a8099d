#!/usr/bin/env bash
# Builds the real Kubernetes components and simulators the e2e harness runs, from pinned Go modules,
# into a cache outside the repo (one folder per component@version). A warm run only checks the cache.
# Usage: e2e/build-tools.sh [etcd kwok inference-sim helm lws kubernetes promtool prometheus gie gateway-api
#                            tokenizers epp pd-sidecar]   (default: all but tokenizers, which epp builds)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
CACHE=${V41F_CACHE:-$HOME/.cache/v41flash}
BIN=$CACHE/bin
mkdir -p "$BIN" "$CACHE/build"
export CGO_ENABLED=0 GOWORK=off GOTOOLCHAIN=local GOFLAGS=-mod=mod
export GOPATH=${GOPATH:-$CACHE/gopath} GOCACHE=${GOCACHE:-$CACHE/gocache}
# GOSUMDB stays at Go's default (sum.golang.org, reached through the same proxy path); only if the
# checksum database is unreachable set GOSUMDB=off in the environment before calling this script.

log() { printf '[build-tools %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# One build per cache at a time (two would share its build and module folders): a second run waits.
if command -v flock >/dev/null; then
  exec 9>"$CACHE/.build-tools.lock"
  flock -n 9 || { log "another build-tools.sh holds $CACHE/.build-tools.lock; waiting for it"; flock 9; }
fi

# have DIR BIN...: true when every listed binary is cached in DIR.
have() { local d="$1"; shift; for b in "$@"; do [ -x "$d/$b" ] || return 1; done; }

# gobuild LABEL ARGS...: go build -v, condensing its one-line-per-package output into a progress line
# every 100 packages (errors and compiler output pass through unchanged).
gobuild() {
  local label=$1; shift
  go build -v "$@" 2>&1 | awk -v label="$label" '
    /^#/ || /:[0-9]+:/ || / / { print; fflush(); next }
    { n++; if (n % 100 == 0) { printf "[build-tools] %s: %d packages compiled\n", label, n; fflush() } }
    END { if (n) printf "[build-tools] %s: %d packages compiled\n", label, n }'
}

# wrapper DIR: a fresh throwaway module to build a main package in.
wrapper() { rm -rf "$1"; mkdir -p "$1"; (cd "$1" && go mod init v41flash.local/build >/dev/null 2>&1); }

# module_src MODULE VERSION: a writable copy of a pinned module's source in ./src (for a build-cache patch).
module_src() {
  local dir; dir=$(go mod download -json "$1@$2" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || { echo "cannot download $1@$2" >&2; exit 1; }
  cp -r "$dir" src && chmod -R u+w src
}

# replace_once FILE FROM TO: replace the one occurrence of FROM (fails unless there is exactly one).
replace_once() {
  local f=$1 from=$2 to=$3
  [ "$(grep -cF "$from" "$f")" = 1 ] || { echo "'$from' not found exactly once in $f" >&2; exit 1; }
  awk -v from="$from" -v to="$to" '{ i = index($0, from); if (i) $0 = substr($0, 1, i-1) to substr($0, i+length(from)); print }' \
    "$f" > "$f.new" && mv "$f.new" "$f"
}

# build_simple NAME VERSION PKG BINNAME [go build flags...]: go get PKG@VERSION, build it to NAME-VERSION/BINNAME.
build_simple() {
  local name=$1 key=$2 pkg=$3 bin=$4; shift 4
  local out="$BIN/$name-$key" t0=$SECONDS
  if have "$out" "$bin"; then log "$name $key cached"; return; fi
  log "building $name $key ($pkg)"
  local w="$CACHE/build/$name"; wrapper "$w"
  (
    cd "$w"
    go get "$pkg@$key"
    mkdir -p "$out.tmp"
    gobuild "$name" -trimpath "$@" -o "$out.tmp/$bin" "$pkg"
  )
  rm -rf "$out"; mv "$out.tmp" "$out"; log "$name $key done in $((SECONDS - t0))s"
}

# llm-d-inference-sim listens on ":<port>" (all interfaces, no host flag), so two simulated pods could
# not both use port 8000 and the harness could not stay on loopback. The build replaces the module with
# a patched copy in the build cache (never in this repo) whose listen host comes from $V41F_SIM_BIND_HOST
# (empty = upstream behaviour). Bump SIM_PATCH when the patch changes.
SIM_PATCH=v41f1
build_inference_sim() {
  local ver=$INFERENCE_SIM_VERSION key="$INFERENCE_SIM_VERSION-$SIM_PATCH" bin=llm-d-inference-sim
  local mod=github.com/llm-d/llm-d-inference-sim out="$BIN/inference-sim-$INFERENCE_SIM_VERSION-$SIM_PATCH" t0=$SECONDS
  if have "$out" "$bin"; then log "inference-sim $key cached"; return; fi
  log "building inference-sim $key ($mod $ver with the bind-host patch)"
  local w="$CACHE/build/inference-sim"; wrapper "$w"
  (
    cd "$w"
    module_src "$mod" "$ver"
    replace_once src/pkg/communication/http.go \
      'net.Listen("tcp4", fmt.Sprintf(":%d", c.simulator.Context.Config().Port))' \
      'net.Listen("tcp4", net.JoinHostPort(v41fBindHost(), strconv.Itoa(c.simulator.Context.Config().Port)))'
    printf '%s\n' 'package communication' '' 'import "os"' '' \
      '// v41fBindHost is the address the simulator listens on (set by the v41flash e2e harness).' \
      'func v41fBindHost() string { return os.Getenv("V41F_SIM_BIND_HOST") }' > src/pkg/communication/v41f_bind.go
    go mod edit "-require=$mod@$ver" "-replace=$mod=./src"
    go get "$mod/cmd/llm-d-inference-sim@$ver"
    mkdir -p "$out.tmp"
    gobuild inference-sim -trimpath -o "$out.tmp/$bin" "$mod/cmd/llm-d-inference-sim"
  )
  rm -rf "$out"; mv "$out.tmp" "$out"; log "inference-sim $key done in $((SECONDS - t0))s"
}

# github.com/daulet/tokenizers' Rust static library (libtokenizers.a + tokenizers.h), which llm-d's endpoint picker
# links through cgo. Upstream's build downloads a prebuilt archive; here cargo builds it from crates.io with the
# module's own Cargo.lock (--locked), about 5 min on 2 busy cores.
build_tokenizers() {
  local ver=$TOKENIZERS_VERSION out="$BIN/tokenizers-$TOKENIZERS_VERSION" t0=$SECONDS
  if have "$out" libtokenizers.a && [ -f "$out/tokenizers.h" ]; then log "tokenizers $ver cached"; return; fi
  command -v cargo >/dev/null || { echo "tokenizers needs cargo (rustup or Debian's cargo)" >&2; exit 1; }
  log "building tokenizers $ver (cargo, crates.io)"
  local w="$CACHE/build/tokenizers"; wrapper "$w"
  (
    cd "$w"
    module_src github.com/daulet/tokenizers "$ver"
    (cd src && CARGO_TARGET_DIR="$w/target" cargo build --release --locked --quiet)
    mkdir -p "$out.tmp"
    install -m 0644 "$w/target/release/libtokenizers.a" src/tokenizers.h "$out.tmp/"
  )
  rm -rf "$out"; mv "$out.tmp" "$out"; log "tokenizers $ver done in $((SECONDS - t0))s"
}

# llm-d's endpoint picker (cmd/epp of llm-d-inference-scheduler). It needs cgo: the precise prefix-cache scorer's
# kv-cache manager links libtokenizers (above), embeds CPython (Python.h; python3-config --embed gives the flags,
# so the binary links this machine's libpython) and subscribes to KV events with github.com/pebbe/zmq4 (libzmq:
# Debian's libzmq3-dev). Its InferencePool CRDs come from the Gateway API Inference Extension module its go.mod
# requires (component gie).
build_epp() {
  local ver=$LLM_D_INFERENCE_SCHEDULER_VERSION out="$BIN/epp-$LLM_D_INFERENCE_SCHEDULER_VERSION" t0=$SECONDS
  local mod=github.com/llm-d/llm-d-inference-scheduler
  if have "$out" epp; then log "epp $ver cached"; return; fi
  build_tokenizers
  command -v python3-config >/dev/null || { echo "epp needs python3-config (Debian: python3-dev)" >&2; exit 1; }
  if ! pkg-config --exists libzmq 2>/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "epp needs libzmq's headers: installing Debian's libzmq3-dev"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libzmq3-dev >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libzmq3-dev >/dev/null; }
  fi
  pkg-config --exists libzmq 2>/dev/null || { echo "epp needs libzmq's headers: apt-get install libzmq3-dev" >&2; exit 1; }
  log "building epp $ver ($mod/cmd/epp, cgo)"
  local w="$CACHE/build/epp" tok="$BIN/tokenizers-$TOKENIZERS_VERSION"; wrapper "$w"
  (
    cd "$w"
    go get "$mod/cmd/epp@$ver"
    mkdir -p "$out.tmp"
    CGO_ENABLED=1 CGO_CFLAGS="$(python3-config --includes) -I$tok" \
      CGO_LDFLAGS="$(python3-config --ldflags --embed) -L$tok -ltokenizers -ldl -lm -lstdc++" \
      gobuild epp -trimpath -o "$out.tmp/epp" "$mod/cmd/epp"
  )
  rm -rf "$out"; mv "$out.tmp" "$out"; log "epp $ver done in $((SECONDS - t0))s"
}

# llm-d's P/D routing sidecar (cmd/pd-sidecar, pure Go). It listens on ":<port>" and sends decodes to
# "localhost:<vllm-port>", so two simulated decode pods on one machine would collide; as for the simulator, the
# build patches a copy of the module in the build cache (never this repo) to use $V41F_SIDECAR_BIND_HOST for both
# (empty = upstream behaviour). Bump SIDECAR_PATCH when the patch changes.
SIDECAR_PATCH=v41f1
build_pd_sidecar() {
  local ver=$LLM_D_INFERENCE_SCHEDULER_VERSION key="$LLM_D_INFERENCE_SCHEDULER_VERSION-$SIDECAR_PATCH"
  local mod=github.com/llm-d/llm-d-inference-scheduler out="$BIN/pd-sidecar-$key" t0=$SECONDS
  if have "$out" pd-sidecar; then log "pd-sidecar $key cached"; return; fi
  log "building pd-sidecar $key ($mod $ver with the bind-host patch)"
  local w="$CACHE/build/pd-sidecar"; wrapper "$w"
  (
    cd "$w"
    module_src "$mod" "$ver"
    replace_once src/pkg/sidecar/proxy/proxy_helpers.go 'net.Listen("tcp", ":"+s.port)' \
      'net.Listen("tcp", net.JoinHostPort(V41fBindHost(), s.port))'
    replace_once src/cmd/pd-sidecar/main.go 'url.Parse(scheme + "://localhost:" + *vLLMPort)' \
      'url.Parse(scheme + "://" + net.JoinHostPort(v41fDecoderHost(), *vLLMPort))'
    replace_once src/cmd/pd-sidecar/main.go '"net/url"' '"net"
	"net/url"'
    printf '%s\n' 'package proxy' '' 'import "os"' '' \
      '// V41fBindHost is the address the sidecar listens on (set by the v41flash e2e harness; "" = every address).' \
      'func V41fBindHost() string { return os.Getenv("V41F_SIDECAR_BIND_HOST") }' > src/pkg/sidecar/proxy/v41f_bind.go
    printf '%s\n' 'package main' '' 'import "github.com/llm-d/llm-d-inference-scheduler/pkg/sidecar/proxy"' '' \
      '// v41fDecoderHost is where the local vLLM listens: the bind host when set, else localhost (upstream).' \
      'func v41fDecoderHost() string { if h := proxy.V41fBindHost(); h != "" { return h }; return "localhost" }' \
      > src/cmd/pd-sidecar/v41f_host.go
    go mod edit "-require=$mod@$ver" "-replace=$mod=./src"
    go get "$mod/cmd/pd-sidecar@$ver"
    mkdir -p "$out.tmp"
    gobuild pd-sidecar -trimpath -ldflags "-s -w" -o "$out.tmp/pd-sidecar" "$mod/cmd/pd-sidecar"
  )
  rm -rf "$out"; mv "$out.tmp" "$out"; log "pd-sidecar $key done in $((SECONDS - t0))s"
}

build_kubernetes() {
  local ver=$KUBERNETES_VERSION out="$BIN/kubernetes-$KUBERNETES_VERSION" t0=$SECONDS
  if have "$out" kube-apiserver kube-controller-manager kube-scheduler; then log "kubernetes $ver cached"; return; fi
  log "building kubernetes $ver (apiserver, controller-manager, scheduler; 20-40 min cold on 2 cores)"
  local w="$CACHE/build/kubernetes"; wrapper "$w"
  # k8s.io/kubernetes requires its staging modules at v0.0.0 with local replaces; point them at the release tags.
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
    gobuild kubernetes -trimpath -ldflags "-s -w $ld" -o "$out.tmp/" k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
  )
  rm -rf "$out"; mv "$out.tmp" "$out"; log "kubernetes $ver done in $((SECONDS - t0))s"
}

# assets NAME VERSION MODULE SRC-PATH...: copy data files the harness needs (CRDs, kwok stages) from the
# pinned module next to the binary, so the harness depends only on $BIN. Cheap when already there.
assets() {
  local name=$1 ver=$2 mod=$3; shift 3
  local out="$BIN/$name-$ver/assets" f missing=""
  for f in "$@"; do [ -f "$out/$(basename "$f")" ] || missing=1; done
  [ -z "$missing" ] && return
  local dir; dir=$(cd "$CACHE/build" && go mod download -json "$mod@$ver" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -n "$dir" ] || { echo "cannot locate $mod@$ver in the module cache" >&2; exit 1; }
  mkdir -p "$out"
  for f in "$@"; do install -m 0644 "$dir/$f" "$out/"; done
  log "$name $ver assets: $*"
}

# helm v3 built without its Makefile assumes Kubernetes 1.20 for .Capabilities; stamp the pinned minor.
k8s_minor=${KUBERNETES_VERSION#v*.}; k8s_minor=${k8s_minor%%.*}
helm_ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  helm_ld="$helm_ld -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$k8s_minor"
done

# Prometheus module v0.MMM.P is release v3.MM.P (prometheus --version prints it).
prom_minor=${PROMTOOL_VERSION#v0.}; prom_minor=${prom_minor%%.*}
prom_ld="-X github.com/prometheus/common/version.Version=${prom_minor:0:1}.${prom_minor:1}.${PROMTOOL_VERSION##*.}"
prom_ld="$prom_ld -X github.com/prometheus/common/version.Branch=HEAD -X github.com/prometheus/common/version.Revision=$PROMTOOL_VERSION"

want=${*:-etcd kwok inference-sim helm lws kubernetes promtool prometheus gie gateway-api epp pd-sidecar}
t_all=$SECONDS
for c in $want; do
  case $c in
    etcd) build_simple etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 etcd \
            -ldflags "-s -w" ;;
    kwok) build_simple kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok kwok -ldflags "-s -w"
          assets kwok "$KWOK_VERSION" sigs.k8s.io/kwok kustomize/stage/node/fast/node-initialize.yaml \
            kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
            kustomize/stage/pod/fast/pod-ready.yaml kustomize/stage/pod/fast/pod-complete.yaml \
            kustomize/stage/pod/fast/pod-delete.yaml kustomize/stage/node/chaos/node-not-ready.yaml ;;
    inference-sim) build_inference_sim ;;
    helm) build_simple helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm helm \
            -ldflags "$helm_ld" ;;
    lws) build_simple lws "$LWS_VERSION" sigs.k8s.io/lws/cmd lws \
           -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION"
         assets lws "$LWS_VERSION" sigs.k8s.io/lws config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml \
           config/webhook/manifests.yaml ;;
    kubernetes) build_kubernetes ;;
    promtool) build_simple promtool "$PROMTOOL_VERSION" github.com/prometheus/prometheus/cmd/promtool promtool \
                -ldflags "-s -w" ;;  # checks the chart's alert rules and dashboard queries
    # The Prometheus server the e2e metrics-source test scrapes the simulators with: the same module and
    # version as promtool (so the second build reuses most of its compiled packages). Without the
    # builtinassets tag the web UI is served from disk (absent: the UI 404s, the HTTP API is unaffected), so
    # no npm build is needed; remove_all_sd + enable_kubernetes_sd keep only the file, HTTP and Kubernetes
    # service discoveries (no cloud SDKs to compile).
    prometheus) build_simple prometheus "$PROMTOOL_VERSION" github.com/prometheus/prometheus/cmd/prometheus prometheus \
                  -tags remove_all_sd,enable_kubernetes_sd -ldflags "-s -w $prom_ld" ;;
    # Gateway mode: the CRDs (unit tests validate rendered InferencePools and HTTPRoutes against them; e2e installs
    # them), the endpoint picker and the P/D sidecar.
    gie) assets gie "$GATEWAY_API_INFERENCE_EXTENSION_VERSION" sigs.k8s.io/gateway-api-inference-extension \
           config/crd/bases/inference.networking.k8s.io_inferencepools.yaml \
           config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml ;;
    gateway-api) assets gateway-api "$GATEWAY_API_VERSION" sigs.k8s.io/gateway-api \
                   config/crd/standard/gateway.networking.k8s.io_httproutes.yaml ;;
    tokenizers) build_tokenizers ;;
    epp) build_epp ;;
    pd-sidecar) build_pd_sidecar ;;
    *) echo "unknown component $c (known: etcd kwok inference-sim helm lws kubernetes promtool prometheus gie" \
            "gateway-api tokenizers epp pd-sidecar)" >&2; exit 2 ;;
  esac
done
log "all tools in $BIN ($((SECONDS - t_all))s)"
