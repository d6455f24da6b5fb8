#!/usr/bin/env bash
# demo.sh: start the local cluster (cmd/devcluster, full tier) and the
# operator against it, and show both healthy. `make demo` builds what it needs
# first. DEMO_KEEP=1 keeps everything running until Ctrl-C.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
dir="${root}/.devcluster"
bin="${root}/bin"
metrics="127.0.0.1:${DEMO_METRICS_PORT:-18080}"
probes="127.0.0.1:${DEMO_PROBE_PORT:-18081}"
mkdir -p "${dir}"

pids=()
cleanup() {
	for pid in "${pids[@]}"; do
		kill "${pid}" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "${pid}" 2>/dev/null || true
	done
}
trap cleanup EXIT

step() { printf '\n==> %s\n' "$*"; }

step "starting the local cluster (etcd, kube-apiserver, controller manager, scheduler, 3 kwok nodes, provisioner)"
rm -f "${dir}/devcluster.out"
"${bin}/devcluster" --dir "${dir}" >"${dir}/devcluster.out" 2>"${dir}/devcluster.err" &
pids+=($!)
for _ in $(seq 1 600); do
	if grep -q '^ready kubeconfig=' "${dir}/devcluster.out" 2>/dev/null; then
		break
	fi
	if ! kill -0 "${pids[0]}" 2>/dev/null; then
		echo "devcluster failed:" >&2
		cat "${dir}/devcluster.err" >&2
		exit 1
	fi
	sleep 0.5
done
grep '^ready kubeconfig=' "${dir}/devcluster.out" || { echo "devcluster not ready after 5 minutes; see ${dir}/logs" >&2; exit 1; }
kubeconfig="${dir}/kubeconfig"
kubectl() { "${bin}/kubectl" --kubeconfig "${kubeconfig}" "$@"; }

step "cluster nodes"
kubectl get nodes -o wide
kubectl get storageclass

step "starting chartpilot run (watches.yaml)"
"${bin}/chartpilot" run --kubeconfig "${kubeconfig}" --watches "${root}/watches.yaml" \
	--metrics-bind-address "${metrics}" --health-probe-bind-address "${probes}" \
	>"${dir}/chartpilot.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do
	if curl -fsS "http://${probes}/readyz" >/dev/null 2>&1; then
		break
	fi
	if ! kill -0 "${pids[1]}" 2>/dev/null; then
		echo "chartpilot failed:" >&2
		cat "${dir}/chartpilot.log" >&2
		exit 1
	fi
	sleep 0.5
done

step "operator health"
printf 'GET /healthz -> %s\n' "$(curl -fsS "http://${probes}/healthz")"
printf 'GET /readyz  -> %s\n' "$(curl -fsS "http://${probes}/readyz")"
printf 'metrics endpoint serves %s series\n' "$(curl -fsS "http://${metrics}/metrics" | grep -vc '^#')"

step "demo done: cluster logs in ${dir}/logs, operator log in ${dir}/chartpilot.log"
if [[ "${DEMO_KEEP:-0}" == 1 ]]; then
	echo "DEMO_KEEP=1: running until Ctrl-C; kubeconfig=${kubeconfig}"
	wait
fi
