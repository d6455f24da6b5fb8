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
rm -rf "${dir}"
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

step "installing the example kind Webapp (test/crds) and a watches file mapping it to test/charts/webapp"
kubectl apply -f "${root}/test/crds/webapps.yaml"
cat >"${dir}/watches.yaml" <<WATCHES
- group: test.chartpilot.dev
  version: v1alpha1
  kind: Webapp
  chart: ${root}/test/charts/webapp
  overrideValues:
    image: nginx:1.27
WATCHES
cat "${dir}/watches.yaml"

step "starting chartpilot run"
"${bin}/chartpilot" run --kubeconfig "${kubeconfig}" --watches "${dir}/watches.yaml" \
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

ns=demo
kubectl create namespace "${ns}" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
wait_ready() {
	kubectl -n "${ns}" wait webapp/shop --for=jsonpath='{.status.release.revision}'="$1" --timeout=120s >/dev/null
	kubectl -n "${ns}" wait webapp/shop --for=condition=Ready --timeout=120s >/dev/null
}

step "apply a Webapp: its spec is the chart's values"
cr="$(cat <<CR
apiVersion: test.chartpilot.dev/v1alpha1
kind: Webapp
metadata:
  name: shop
  namespace: ${ns}
spec:
  message: hello from chartpilot
  replicas: 2
CR
)"
printf '%s\n' "${cr}"
printf '%s\n' "${cr}" | kubectl apply -f -
wait_ready 1
kubectl -n "${ns}" get webapps
kubectl -n "${ns}" get deploy,svc,cm -l chartpilot.dev/release=shop

step "change a value: the release is upgraded to revision 2"
kubectl -n "${ns}" patch webapp shop --type merge -p '{"spec":{"message":"upgraded","replicas":3}}'
wait_ready 2
kubectl -n "${ns}" get webapps
kubectl -n "${ns}" get cm shop-config -o jsonpath='message={.data.message}{"\n"}'

step "drift: delete the Service behind chartpilot's back; it comes back"
kubectl -n "${ns}" delete svc shop
kubectl -n "${ns}" wait --for=create svc/shop --timeout=60s >/dev/null 2>&1 || sleep 3
kubectl -n "${ns}" get svc shop
kubectl -n "${ns}" get events --field-selector involvedObject.name=shop -o custom-columns=REASON:.reason,MESSAGE:.message

step "status of the Webapp"
kubectl -n "${ns}" get webapp shop -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}){"\n"}{end}'
kubectl -n "${ns}" get webapp shop -o jsonpath='release: {.status.release}{"\n"}'

step "delete the Webapp: the release and its objects are uninstalled"
kubectl -n "${ns}" delete webapp shop --timeout=120s
kubectl -n "${ns}" get deploy,svc,cm,secrets 2>&1 | sed 's/^/  /'

step "demo done: cluster logs in ${dir}/logs, operator log in ${dir}/chartpilot.log"
if [[ "${DEMO_KEEP:-0}" == 1 ]]; then
	echo "DEMO_KEEP=1: running until Ctrl-C; kubeconfig=${kubeconfig}"
	wait
fi
