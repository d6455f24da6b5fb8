# chartpilot — make targets. Tools are pinned in hack/tools and built into bin/.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

BIN := $(CURDIR)/bin
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Packages whose tests need the local control plane run with a generous timeout.
TEST_TIMEOUT ?= 30m
TEST_FLAGS ?=
# The older Kubernetes minors of the version matrix (the newest is bin/'s);
# their control planes are built into bin/kubernetes-<minor>/.
OLDER_MINORS := 1.35 1.36

.PHONY: image bundle all build test test-matrix test-unit tools tools-demo tools-dev generate manifests monitoring-crds lint verify demo bench fuzz fmt vet clean

all: build

## build: chartpilot and chartpilot-manager (the manager without the backup data path; built as the image builds them: static, without symbol tables) and devcluster into bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN)/chartpilot ./cmd/chartpilot
	CGO_ENABLED=0 $(GO) build -tags manager -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(BIN)/chartpilot-manager ./cmd/chartpilot
	ln -sf chartpilot $(BIN)/kubectl-chartpilot
	$(GO) build -o $(BIN)/devcluster ./cmd/devcluster
	$(GO) build -o $(BIN)/demorepo ./hack/demorepo

## image: the multi-arch (linux/amd64, linux/arm64) OCI image, built without Docker or a base image, as an OCI layout in bin/image/oci; IMAGE=registry/repo:tag pushes it ($$IMAGE_USERNAME/$$IMAGE_PASSWORD)
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
image:
	@for p in $(IMAGE_PLATFORMS); do \
		arch=$${p#linux/}; echo "building chartpilot for $$p"; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" \
			-o $(BIN)/image/linux-$$arch/chartpilot ./cmd/chartpilot || exit 1; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -tags manager -trimpath -ldflags "-s -w -X main.version=$(VERSION)" \
			-o $(BIN)/image/linux-$$arch/chartpilot-manager ./cmd/chartpilot || exit 1; \
	done
	$(GO) run ./hack/image -out $(BIN)/image/oci -version $(VERSION) -revision $(REVISION) -created $(SOURCE_DATE_EPOCH) \
		$(foreach p,$(IMAGE_PLATFORMS),-binary $(p)=$(BIN)/image/linux-$(subst linux/,,$(p))/chartpilot -manager $(p)=$(BIN)/image/linux-$(subst linux/,,$(p))/chartpilot-manager) \
		$(if $(IMAGE),-push $(IMAGE))

## bundle: the OLM bundle (ClusterServiceVersion, CRDs, annotations) in bundle/, from config/; BUNDLE_VERSION sets its version
BUNDLE_VERSION ?= 0.1.0
bundle:
	$(GO) run ./hack/bundle -version $(BUNDLE_VERSION) -created $(SOURCE_DATE_EPOCH) -out bundle

## tools: Debian's PostgreSQL 15 and redis-server when missing, control-plane binaries (kube-apiserver, controller manager, scheduler, kubectl, etcd, kwok), real nodes' binaries (containerd, runc, kubelet, kube-proxy, CNI plugins, CoreDNS) and images (Debian's packages, mmdebstrap), the S3 server of the backup tests (versitygw), promtool, Azurite (npm), PostgreSQL 17 server binaries (npm)
tools:
	hack/debian-packages.sh
	hack/tools/build.sh kubernetes etcd kwok versitygw prometheus containerd runc kubelet cni coredns $(addprefix kubernetes-,$(OLDER_MINORS))
	hack/azurite.sh
	hack/embedded-postgres.sh
	hack/images.sh

## tools-demo: only what make demo runs: kube-apiserver, controller manager, scheduler, kubectl, etcd, kwok
tools-demo:
	hack/tools/build.sh kubernetes etcd kwok

## tools-dev: controller-gen and golangci-lint (not needed by the tests)
tools-dev:
	hack/tools/build.sh controller-gen golangci-lint

## test: every test, integration tests on a real local control plane of the newest Kubernetes minor, then the e2e tests on the older minors (test-matrix)
test: tools build
	$(GO) vet ./...
	$(GO) vet -tags manager ./cmd/chartpilot
	$(GO) test -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) ./...
	$(E2E_MATRIX)

## test-matrix: the e2e tests on the control planes of the older Kubernetes minors (OLDER_MINORS)
test-matrix: tools build
	$(E2E_MATRIX)

E2E_MATRIX = @for v in $(OLDER_MINORS); do \
		echo "e2e tests on Kubernetes $$v"; \
		CHARTPILOT_KUBERNETES=$$v $(GO) test -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) ./test/e2e || exit 1; \
	done

## fuzz: each fuzz target for FUZZTIME (make test runs their seed inputs only)
FUZZTIME ?= 30s
fuzz:
	@for spec in ./internal/watches:FuzzParse ./internal/helm:FuzzParseManifest ./internal/policy:FuzzParseWindows ./internal/policy:FuzzParseMajors \
	    ./internal/admission:FuzzHandle ./internal/kinds/postgres:FuzzValuesAndFacts ./internal/kinds:FuzzGenericFacts; do \
		pkg=$${spec%%:*}; target=$${spec##*:}; \
		echo "fuzz $$target ($$pkg) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

## test-unit: tests that need no cluster
test-unit:
	$(GO) test -short ./...

## generate: deepcopy code from the API types
generate: tools-dev
	@if [ -d internal/api ]; then $(BIN)/controller-gen object paths=./internal/api/...; fi

## manifests: CRDs from kubebuilder markers; the manager's and the deployer's roles from watches.yaml and its charts
manifests: tools-dev
	@if [ -d internal/api ]; then $(BIN)/controller-gen crd paths=./internal/api/... output:crd:artifacts:config=config/crd/bases; fi
	$(GO) run ./cmd/chartpilot rbac --watches watches.yaml --crds config/crd --deployer chartpilot-deployer > config/rbac/role.yaml
	$(GO) run ./cmd/chartpilot rbac --watches watches.yaml --crds config/crd --deployer chartpilot-deployer --rules-only --webhook-configuration "" > charts/chartpilot/files/manager-rules.yaml
	$(GO) run ./cmd/chartpilot rbac --watches watches.yaml --crds config/crd --deployer-rules-only > charts/chartpilot/files/deployer-rules.yaml
	rm -f charts/chartpilot/crds/*.yaml && cp config/crd/bases/*.yaml config/crd/passthrough/*.yaml charts/chartpilot/crds/

## monitoring-crds: the Prometheus Operator's ServiceMonitor and PrometheusRule CRDs the tests install, generated from its API module
PROMETHEUS_OPERATOR_VERSION ?= v0.95.2
monitoring-crds: tools-dev
	dir=$$($(GO) mod download -json github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring@$(PROMETHEUS_OPERATOR_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p') && \
	tmp=$$(mktemp -d) && (cd $$dir && GOFLAGS=-mod=mod $(BIN)/controller-gen crd:maxDescLen=0 paths=./v1/... output:crd:dir=$$tmp) && \
	cp $$tmp/monitoring.coreos.com_servicemonitors.yaml $$tmp/monitoring.coreos.com_prometheusrules.yaml test/e2e/testdata/ && rm -rf $$tmp

## lint: golangci-lint v2 (pinned) with .golangci.yml
lint: tools-dev
	$(BIN)/golangci-lint run ./...

fmt:
	gofmt -w cmd internal hooks test

vet:
	$(GO) vet ./...
	$(GO) vet -tags manager ./cmd/chartpilot

## verify: fail when generated files or formatting are out of date
verify: generate manifests
	@test -z "$$(gofmt -l cmd internal hooks test)" || { echo "gofmt needed:"; gofmt -l cmd internal hooks test; exit 1; }
	@git diff --exit-code -- config internal hooks || { echo "generated files are out of date: run make generate manifests and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- config internal)" || { echo "untracked generated files:"; git status --porcelain -- config internal; exit 1; }

## demo: local cluster + operator, shown healthy (no cluster needed)
demo: tools-demo build
	hack/demo.sh

## bench: benchmark table (see test/bench)
bench: tools build
	$(GO) run ./test/bench $(BENCH_FLAGS)

clean:
	rm -rf $(BIN) .devcluster
