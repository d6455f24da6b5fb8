#!/usr/bin/env bash
# demo.sh: start the local cluster (cmd/devcluster, full tier) and the
# operator against it, and show both healthy. `make demo` builds what it needs
# first. DEMO_KEEP=1 keeps everything running until Ctrl-C; DEMO_DIR,
# DEMO_METRICS_PORT and DEMO_PROBE_PORT move its files and ports (the test
# of the demo uses them).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
dir="${DEMO_DIR:-${root}/.devcluster}"
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

# wait_for TRIES PID LOG COMMAND...: run COMMAND every half second until it
# succeeds; fail with LOG if PID dies first or TRIES run out.
wait_for() {
	local tries="$1" pid="$2" log="$3"
	shift 3
	for _ in $(seq 1 "${tries}"); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		if ! kill -0 "${pid}" 2>/dev/null; then
			echo "failed; its output:" >&2
			cat "${log}" >&2
			exit 1
		fi
		sleep 0.5
	done
	echo "not ready after $((tries / 2)) seconds; see ${log}" >&2
	exit 1
}

step "starting the local cluster (etcd, kube-apiserver, controller manager, scheduler, 3 kwok nodes, provisioner)"
rm -f "${dir}/devcluster.out"
"${bin}/devcluster" --dir "${dir}" --crds=false --webhooks "${root}/config/webhook/manifests.yaml" >"${dir}/devcluster.out" 2>"${dir}/devcluster.err" &
pids+=($!)
wait_for 600 "${pids[0]}" "${dir}/devcluster.err" grep -q '^ready kubeconfig=' "${dir}/devcluster.out"
grep '^ready kubeconfig=' "${dir}/devcluster.out"
# The admission webhook (config/webhook) is installed pointing at this
# machine, with certificates made for it: the operator serves it.
webhook_port="$(sed -n 's/^webhook port=\([0-9]*\) .*/\1/p' "${dir}/devcluster.out")"
webhook_certs="$(sed -n 's/^webhook port=[0-9]* cert-dir=\(.*\)$/\1/p' "${dir}/devcluster.out")"
kubeconfig="${dir}/kubeconfig"
kubectl() { "${bin}/kubectl" --kubeconfig "${kubeconfig}" "$@"; }
chartpilot() { "${bin}/chartpilot" "$@" --kubeconfig "${kubeconfig}"; }

step "cluster nodes"
kubectl get nodes -o wide
kubectl get storageclass

step "installing the CRDs (config/crd): Postgres (typed) and Redis (passthrough); Webapp (a fleet kind of the demo)"
kubectl apply -k "${root}/config/crd"
kubectl apply -f "${root}/test/crds/webapps.yaml"

step "the deployer ClusterRole: locked down, every write made for a resource runs as ServiceAccount chartpilot-deployer of its namespace, bound there to this role"
{
	printf 'apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: chartpilot-deployer}\nrules:\n'
	cat "${root}/charts/chartpilot/files/deployer-rules.yaml"
} | kubectl apply -f -

# A chart repository served on loopback, with test/charts/webapp 1.0.0.
repo="${dir}/repo"
mkdir -p "${repo}"
"${bin}/demorepo" serve -dir "${repo}" >"${dir}/demorepo.out" 2>&1 &
pids+=($!)
wait_for 60 "${pids[-1]}" "${dir}/demorepo.out" grep -q '^serving ' "${dir}/demorepo.out"
repo_url="$(sed -n 's/^serving //p' "${dir}/demorepo.out")"
publish() { "${bin}/demorepo" publish -dir "${repo}" -url "${repo_url}" -chart "${root}/test/charts/webapp" "$@"; }
publish -version 1.0.0

# The repository's watches.yaml, and the Webapp fleet from that repository.
sed "s|chart: charts/|chart: ${root}/charts/|" "${root}/watches.yaml" >"${dir}/watches.yaml"
cat >>"${dir}/watches.yaml" <<YAML

# The demo's fleet: a chart from a repository, canaries first.
- group: test.chartpilot.dev
  version: v1alpha1
  kind: Webapp
  chart: {repo: "${repo_url}", name: webapp, interval: 10s}
  maxConcurrentUpgrades: 4
  canarySoak: 10s
  healthTimeout: 20s
YAML
cat "${dir}/watches.yaml"

step "starting chartpilot-manager run --watches watches.yaml (the image's entrypoint; and the demo's Webapp fleet)"
"${bin}/chartpilot-manager" run --kubeconfig "${kubeconfig}" --watches "${dir}/watches.yaml" \
	--metrics-bind-address "${metrics}" --health-probe-bind-address "${probes}" \
	--webhook-port "${webhook_port}" --webhook-cert-dir "${webhook_certs}" --webhook-certs files \
	--default-service-account chartpilot-deployer ${DEMO_OPERATOR_ARGS:-} \
	>"${dir}/chartpilot.log" 2>&1 &
pids+=($!)
wait_for 120 "${pids[1]}" "${dir}/chartpilot.log" curl -fsS "http://${probes}/readyz"
printf 'GET /healthz -> %s\n' "$(curl -fsS "http://${probes}/healthz")"

ns=demo
kubectl create namespace "${ns}"
chartpilot identity create -n "${ns}"

step "apply the samples: a Postgres and a Redis (config/samples)"
cat "${root}/config/samples/postgres.yaml" "${root}/config/samples/redis.yaml"
kubectl -n "${ns}" apply -f "${root}/config/samples/postgres.yaml" -f "${root}/config/samples/redis.yaml"
kubectl -n "${ns}" wait postgres/orders redis/sessions --for=condition=Ready --timeout=180s
kubectl -n "${ns}" wait postgres/orders --for=jsonpath='{.status.readyReplicas}'=1 --timeout=180s
kubectl -n "${ns}" get postgres,redis
kubectl -n "${ns}" get statefulsets,services,pvc

step "the fleet as chartpilot get shows it (one line per resource; also kubectl chartpilot get)"
chartpilot get -n "${ns}"

step "what the Postgres status says (endpoints, auto-tuned settings)"
kubectl -n "${ns}" get postgres orders -o jsonpath='endpoints: {.status.endpoints}{"\n"}tuning:    {.status.tuning}{"\n"}'

step "drift: delete the read-only Service behind chartpilot's back; it comes back"
kubectl -n "${ns}" delete svc orders-ro
kubectl -n "${ns}" wait --for=create svc/orders-ro --timeout=60s >/dev/null
kubectl -n "${ns}" get svc orders-ro
kubectl -n "${ns}" get events --field-selector involvedObject.name=orders,reason=DriftCorrected -o custom-columns=REASON:.reason,MESSAGE:.message

step "scale the Postgres to 3 replicas: the StatefulSet follows"
kubectl -n "${ns}" patch postgres orders --type merge -p '{"spec":{"replicas":3}}'
kubectl -n "${ns}" wait postgres/orders --for=jsonpath='{.status.readyReplicas}'=3 --timeout=180s
kubectl -n "${ns}" get postgres orders
kubectl -n "${ns}" get statefulset orders
kubectl -n "${ns}" get pvc -l app.kubernetes.io/instance=orders

step "bad input is refused at admission: shrinking storage"
kubectl -n "${ns}" patch postgres orders --type merge -p '{"spec":{"storage":{"size":"1Gi"}}}' 2>&1 | sed 's/^/  /' || true

step "chartpilot describe postgres/orders: conditions, history, events"
chartpilot describe postgres/orders -n "${ns}"

step "delete the Postgres: the release is uninstalled, the data volumes and the password stay"
kubectl -n "${ns}" delete postgres orders --timeout=120s
kubectl -n "${ns}" get statefulsets,pvc,secrets -l app.kubernetes.io/instance=orders 2>&1 | sed 's/^/  /'

step "a fleet of 20 Webapps on chart webapp 1.0.0 from the repository (app-01 and app-02 are canaries)"
kubectl create namespace fleet
chartpilot identity create -n fleet
for i in $(seq -w 1 20); do
	canary=""
	if [[ "${i}" == 01 || "${i}" == 02 ]]; then canary='labels: {chartpilot.dev/canary: "true"}'; fi
	printf -- '---\napiVersion: test.chartpilot.dev/v1alpha1\nkind: Webapp\nmetadata: {name: app-%s, %s}\nspec: {message: hello}\n' "${i}" "${canary}"
done | sed 's/, }/}/' | kubectl -n fleet apply -f - >/dev/null
kubectl -n fleet wait webapps --all --for=condition=Ready --timeout=300s | tail -n 1
chartpilot rollout status webapps -n fleet

step "webapp 1.1.0 published: the canaries first, a 10 s soak, then the rest, at most 4 at a time"
publish -version 1.1.0
chartpilot rollout status webapps -n fleet --version 1.1.0 --watch

step "webapp 1.2.0, broken (its pods never become ready): the canary is rolled back, the rollout halts, the rest keep serving 1.1.0"
publish -version 1.2.0 -unhealthy
if chartpilot rollout status webapps -n fleet --version 1.2.0 --watch; then
	echo "the rollout of 1.2.0 finished" >&2
	exit 1
fi
echo "the rollout of 1.2.0 halted (exit 1)"
chartpilot get webapps -n fleet | sed -n '1,6p'

step "webapp 2.0.0: a new major waits for the opt-in annotation chartpilot.dev/allow-major-upgrade"
publish -version 2.0.0
kubectl -n fleet wait webapp/app-05 --for=jsonpath='{.status.chart.availableUpgrade}'=2.0.0 --timeout=120s >/dev/null
kubectl -n fleet get webapp app-05 -o jsonpath='app-05: deployed {.status.chart.deployedVersion}, 2.0.0 available and held back: a new major needs chartpilot.dev/allow-major-upgrade: "2"{"\n"}'

step "tenants: two teams with their own values and limits on the same kind"
kubectl create namespace team-a
kubectl create namespace team-b
chartpilot identity create -n team-a
chartpilot identity create -n team-b
tenants="$(cat <<'YAML'
apiVersion: chartpilot.dev/v1alpha1
kind: Tenant
metadata: {name: team-a}
spec:
  namespaces: [team-a]
  values:
    - kind: Redis
      values: {image: {tag: "7.2"}}
  limits: {maxReplicas: 1, maxStorage: 2Gi}
---
apiVersion: chartpilot.dev/v1alpha1
kind: Tenant
metadata: {name: team-b}
spec:
  namespaces: [team-b]
  values:
    - kind: Redis
      values: {image: {tag: "7.4"}}
  limits: {maxReplicas: 3}
YAML
)"
echo "${tenants}"
echo "${tenants}" | kubectl apply -f -
for team in team-a team-b; do
	printf 'apiVersion: chartpilot.dev/v1alpha1\nkind: Redis\nmetadata: {name: cache}\nspec: {}\n' | kubectl -n "${team}" apply -f -
done
kubectl -n team-a wait redis/cache --for=condition=Ready --timeout=180s
kubectl -n team-b wait redis/cache --for=condition=Ready --timeout=180s
for team in team-a team-b; do
	printf '%s: Redis image %s\n' "${team}" "$(kubectl -n "${team}" get deployment cache -o jsonpath='{.spec.template.spec.containers[0].image}')"
done
chartpilot tenants

step "over its tenant's limit, a resource is refused at admission, with the reason"
printf 'apiVersion: chartpilot.dev/v1alpha1\nkind: Postgres\nmetadata: {name: big}\nspec: {version: "17", replicas: 3, storage: {size: 1Gi}}\n' |
	kubectl -n team-a apply -f - 2>&1 | sed 's/^/  /' || true

step "demo done: cluster logs in ${dir}/logs, operator log in ${dir}/chartpilot.log"
echo "try next: ${bin}/chartpilot get -A --kubeconfig ${kubeconfig}; chartpilot describe postgres/... ; DEMO_KEEP=1 make demo keeps it running"
if [[ "${DEMO_KEEP:-0}" == 1 ]]; then
	echo "DEMO_KEEP=1: running until Ctrl-C; kubeconfig=${kubeconfig}"
	wait
fi
