#!/usr/bin/env bash
# build.sh builds the pinned tools of hack/tools into bin/.
#
# Each tool lives in a Go module of its own under hack/tools/<module>, because
# their dependency graphs conflict (kubernetes, etcd, kwok, controller-gen and
# golangci-lint each pin different versions of grpc, otel and k8s.io/*).
# A tool is rebuilt only when its module's files changed since the last build:
# bin/.stamp-<module> holds the hash of go.mod, go.sum, the module's sources and
# this script. A warm run costs a few hundredths of a second per tool.
# Built binaries are also kept in ${XDG_CACHE_HOME:-~/.cache}/chartpilot/tools/
# by stamp, so a fresh clone on the same machine (CI) copies them instead of
# building again. CHARTPILOT_TOOLS_CACHE=off disables that cache.
#
# Usage: hack/tools/build.sh [module ...]   (default: every module)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tools="${root}/hack/tools"
bin="${root}/bin"
mkdir -p "${bin}"

# k8s_ldflags VERSION: the version a Kubernetes binary reports (/version, --version).
k8s_ldflags() {
	local version="$1" minor flags="-s -w" pkg
	minor="${version#v1.}"
	minor="${minor%%.*}"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X ${pkg}.gitVersion=${version} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
		flags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.gitCommit=chartpilot-pinned"
	done
	echo "${flags}"
}
k8s_version="v1.37.2"
# The older minors of the version matrix: their control planes only, each in
# bin/kubernetes-<minor>/ (the e2e tests run against them with
# CHARTPILOT_KUBERNETES=<minor>; kubectl, the kubelet and client-go stay at
# the newest).
k8s_older=(v1.35.4 v1.36.3)

# binaries per module: "<import path>=<output name>" pairs.
declare -A targets=(
	[kubernetes]="k8s.io/kubernetes/cmd/kube-apiserver=kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager=kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler=kube-scheduler k8s.io/kubernetes/cmd/kubectl=kubectl"
	[etcd]="./cmd/etcd=etcd"
	[kwok]="sigs.k8s.io/kwok/cmd/kwok=kwok"
	[controller-gen]="sigs.k8s.io/controller-tools/cmd/controller-gen=controller-gen"
	[golangci-lint]="github.com/golangci/golangci-lint/v2/cmd/golangci-lint=golangci-lint"
	[versitygw]="github.com/versity/versitygw/cmd/versitygw=versitygw"
	[prometheus]="github.com/prometheus/prometheus/cmd/promtool=promtool github.com/prometheus/prometheus/cmd/prometheus=prometheus"
	[containerd]="github.com/containerd/containerd/v2/cmd/containerd=containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2=containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr=ctr"
	[runc]="github.com/opencontainers/runc=runc"
	[kubelet]="k8s.io/kubernetes/cmd/kubelet=kubelet k8s.io/kubernetes/cmd/kube-proxy=kube-proxy"
	[coredns]="github.com/coredns/coredns=coredns"
	[cni]="github.com/containernetworking/plugins/plugins/main/bridge=cni/bridge github.com/containernetworking/plugins/plugins/ipam/host-local=cni/host-local github.com/containernetworking/plugins/plugins/main/loopback=cni/loopback github.com/containernetworking/plugins/plugins/meta/portmap=cni/portmap"
)
declare -A ldflags=(
	[kubernetes]="$(k8s_ldflags "${k8s_version}")"
	[etcd]="-s -w"
	[kwok]="-s -w"
	[controller-gen]="-s -w"
	[golangci-lint]="-s -w"
	[versitygw]="-s -w"
	[prometheus]="-s -w"
	[containerd]="-s -w"
	[runc]="-s -w"
	[kubelet]="$(k8s_ldflags "${k8s_version}")"
	[cni]="-s -w"
	[coredns]="-s -w"
)
for v in "${k8s_older[@]}"; do
	m="${v#v}"
	m="kubernetes-${m%.*}"
	targets[${m}]=""
	for c in kube-apiserver kube-controller-manager kube-scheduler; do
		targets[${m}]+="k8s.io/kubernetes/cmd/${c}=${m}/${c} "
	done
	ldflags[${m}]="$(k8s_ldflags "${v}")"
done
# Build tags, and the modules built with cgo (runc links libseccomp:
# Debian's libseccomp-dev, installed by hack/debian-packages.sh).
declare -A tags=(
	# Kubernetes service discovery only (the tests' ServiceMonitors); no web UI assets.
	[prometheus]="remove_all_sd enable_kubernetes_sd"
	[containerd]="no_btrfs no_devmapper no_zfs"
	[runc]="seccomp"
)
declare -A cgo=(
	[runc]=1
)
# How long a cold build of each module took on 2 cores (module downloads
# included; kubelet after kubernetes, whose packages it shares), printed so
# that a first build says what it is waiting for.
declare -A cold=(
	[kubernetes]="about 7 minutes"
	[etcd]="about 30 seconds"
	[kwok]="about 80 seconds"
	[versitygw]="about a minute"
	[prometheus]="about 2.5 minutes"
	[containerd]="about a minute"
	[runc]="about 10 seconds"
	[kubelet]="about a minute"
	[kubernetes-1.35]="about 7 minutes"
	[kubernetes-1.36]="about 7 minutes"
	[cni]="a few seconds"
	[coredns]="about 2 minutes"
)

stamp_of() {
	local mod="$1"
	(cd "${tools}/${mod}" && find . -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' -o -name '*.yaml' \) -print0 | sort -z | xargs -0 sha256sum
		sha256sum "${tools}/build.sh" | cut -d' ' -f1
		go env GOVERSION) | sha256sum | cut -d' ' -f1
}

# copy_kwok_stages puts the stages that ship in kwok's own module (fast node
# initialisation, node heartbeats renewing Leases, fast pod lifecycle) into
# bin/kwok-stages: kwok refuses to start without stages.
copy_kwok_stages() {
	local dir
	dir="$(cd "${tools}/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
	rm -rf "${bin}/kwok-stages"
	mkdir -p "${bin}/kwok-stages"
	cp "${dir}/kustomize/stage/node/fast/node-initialize.yaml" \
		"${dir}/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
		"${dir}"/kustomize/stage/pod/fast/pod-*.yaml "${bin}/kwok-stages/"
	chmod 0644 "${bin}"/kwok-stages/*.yaml
}

build_module() {
	local mod="$1" want have pair pkg out
	want="$(stamp_of "${mod}")"
	have="$(cat "${bin}/.stamp-${mod}" 2>/dev/null || true)"
	local missing=0
	for pair in ${targets[${mod}]}; do
		[[ -x "${bin}/${pair#*=}" ]] || missing=1
	done
	if [[ "${mod}" == kwok && ! -f "${bin}/kwok-stages/node-initialize.yaml" ]]; then
		missing=1
	fi
	if [[ "${want}" == "${have}" && "${missing}" == 0 ]]; then
		return 0
	fi
	local cache=""
	if [[ "${CHARTPILOT_TOOLS_CACHE:-}" != off ]]; then
		cache="${CHARTPILOT_TOOLS_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/chartpilot/tools}/${mod}-${want}"
	fi
	if [[ -n "${cache}" && -f "${cache}/.complete" ]]; then
		for pair in ${targets[${mod}]}; do
			mkdir -p "$(dirname "${bin}/${pair#*=}")"
			cp "${cache}/${pair#*=}" "${bin}/${pair#*=}.tmp"
			mv "${bin}/${pair#*=}.tmp" "${bin}/${pair#*=}"
		done
		if [[ "${mod}" == kwok ]]; then
			copy_kwok_stages
		fi
		echo "${want}" > "${bin}/.stamp-${mod}"
		echo "copied ${mod} tools from ${cache}" >&2
		return 0
	fi
	echo "building ${mod} tools into bin/ (a cold build takes ${cold[${mod}]:-a while} on 2 cores)" >&2
	local start=${SECONDS} pkgs=() tmp="${bin}/.build-${mod}"
	for pair in ${targets[${mod}]}; do
		pkgs+=("${pair%=*}")
	done
	# One go build for all of a module's commands: their shared packages are
	# compiled once and the links overlap the compiles. -o into a directory
	# names each binary after its package's last element.
	rm -rf "${tmp}"
	mkdir -p "${tmp}"
	(cd "${tools}/${mod}" && CGO_ENABLED="${cgo[${mod}]:-0}" go build -trimpath -tags "${tags[${mod}]:-}" -ldflags "${ldflags[${mod}]}" -o "${tmp}/" "${pkgs[@]}")
	for pair in ${targets[${mod}]}; do
		pkg="${pair%=*}"
		out="${pair#*=}"
		mkdir -p "$(dirname "${bin}/${out}")"
		mv "${tmp}/${pkg##*/}" "${bin}/${out}"
	done
	rm -rf "${tmp}"
	if [[ "${mod}" == kwok ]]; then
		copy_kwok_stages
	fi
	echo "${want}" > "${bin}/.stamp-${mod}"
	if [[ -n "${cache}" ]] && mkdir -p "${cache}" 2>/dev/null; then
		for pair in ${targets[${mod}]}; do
			mkdir -p "$(dirname "${cache}/${pair#*=}")"
			cp "${bin}/${pair#*=}" "${cache}/${pair#*=}"
		done
		touch "${cache}/.complete"
	fi
	echo "built ${mod} tools in $((SECONDS - start))s" >&2
}

mods=("$@")
if [[ ${#mods[@]} -eq 0 ]]; then
	mods=(kubernetes etcd kwok controller-gen golangci-lint)
fi
for mod in "${mods[@]}"; do
	if [[ -z "${targets[${mod}]:-}" ]]; then
		echo "hack/tools/build.sh: unknown tool module ${mod}" >&2
		exit 2
	fi
	build_module "${mod}"
done
