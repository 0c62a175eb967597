# Bulkhead — `make help` lists every target.
SHELL := /usr/bin/env bash
# The Go toolchain Bulkhead builds with: a patched go1.26 (go1.26.10 fixes
# the net/http and crypto/x509 advisories govulncheck reports against
# go1.26.8, docs/security.md). The go command fetches it from the module
# proxy on first use; GOTOOLCHAIN=local (or another value) in the
# environment overrides it.
GOTOOLCHAIN ?= go1.26.10
export GOTOOLCHAIN
# Under `sudo make ...` builds and tools run as the invoking user (SUDO_USER),
# with their own go and into their own caches; only the node runs as root.
# Their go is found through their login shell, then in the usual places.
ifneq ($(and $(SUDO_USER),$(filter-out root,$(SUDO_USER))),)
USER_HOME := $(shell getent passwd $(SUDO_USER) | cut -d: -f6)
AS_USER := sudo -u $(SUDO_USER) -H env GOTOOLCHAIN=$(GOTOOLCHAIN)
ifeq ($(origin GO),undefined)
GO := $(or $(shell $(AS_USER) bash -lic 'command -v go' 2>/dev/null </dev/null | tail -n 1),$(firstword $(wildcard /usr/local/go/bin/go $(USER_HOME)/go/bin/go $(USER_HOME)/.local/go/bin/go $(USER_HOME)/sdk/go*/bin/go /usr/lib/go/bin/go)),go)
endif
else
USER_HOME := $(HOME)
AS_USER :=
GO ?= go
endif
TOOLS_DIR ?= $(USER_HOME)/.cache/bulkhead/tools
export TOOLS_DIR
BIN := $(CURDIR)/bin
# The release every binary reports (`bulkhead version`, `--version`, the
# gVisor shim's runtime info to containerd): the nearest tag, or the commit,
# and -dirty for a changed tree. The commit is stamped too: the go command's
# own VCS stamp is off where GOFLAGS holds -buildvcs=false or .git is absent.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X github.com/bulkhead-runtime/bulkhead/internal/version.Version=$(VERSION) -X github.com/bulkhead-runtime/bulkhead/internal/version.Commit=$(COMMIT)
# go-nvml's cgo wrappers reference every NVML entry point its header marks
# DEPRECATED(13.0), so each build of it prints 29 -Wdeprecated-declarations
# warnings (about 150 lines) from code that is not ours; Bulkhead calls none
# of those entry points and has no C of its own. Only that warning is
# silenced; set CGO_CFLAGS to see it again.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.DEFAULT_GOAL := help

.PHONY: help
help: ## List every target with what it does.
	@if [ -t 1 ]; then on=$$'\033[36m' off=$$'\033[0m'; else on= off=; fi; \
	awk -v on="$$on" -v off="$$off" 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %s%-16s%s %s\n", on, $$1, off, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the shims, the agent, the CLI and the webhook into ./bin, and the agent and CLI with the mock GPU node (tag bulkhead_mockgpu) into ./bin/mockgpu for the demo and the tests.
	@mkdir -p $(BIN)/mockgpu
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...
	$(GO) build -ldflags "$(LDFLAGS)" -tags bulkhead_mockgpu -o $(BIN)/mockgpu/ ./cmd/bulkhead-agent ./cmd/bulkhead
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./test/images/netprobe

.PHONY: build-failpoints
build-failpoints: ## Build the test agent that honours BULKHEAD_TEST_FAIL_AT, with the mock GPU node, into ./bin/failpoints (e2e tests only).
	@mkdir -p $(BIN)/failpoints
	$(GO) build -ldflags "$(LDFLAGS)" -tags 'bulkhead_failpoints bulkhead_mockgpu' -o $(BIN)/failpoints/ ./cmd/bulkhead-agent

.PHONY: images
images: ## Build the webhook, node-agent and node-installer images reproducibly (pinned Go, pinned Debian base) into ./bin/images as OCI archives for `ctr images import`, and print their digests (docs/release.md).
	GO=$(GO) VERSION=$(VERSION) COMMIT=$(COMMIT) LDFLAGS="$(LDFLAGS)" bash deploy/image/images.sh

.PHONY: images-check
images-check: ## make images twice, binaries included, into scratch directories: fail unless the digests and archives are the same (docs/release.md).
	GO=$(GO) VERSION=$(VERSION) COMMIT=$(COMMIT) LDFLAGS="$(LDFLAGS)" bash deploy/image/images.sh --check

.PHONY: deps
deps: ## Install the Debian packages a node and the tests need (CNI plugins, busybox-static, iproute2, gcc, libseccomp-dev, pkg-config, etcd-server, nftables); root.
	bash test/scripts/deps.sh

.PHONY: tools-node
tools-node: ## Install only what a local node needs (containerd, ctr, runsc, crictl, opa, runc) into TOOLS_DIR (cached; ~20 min cold): make demo uses it.
	GO=$(GO) bash test/scripts/tools.sh node

.PHONY: tools-bench
tools-bench: ## tools-node and the upstream shims containerd-shim-runc-v2 and containerd-shim-runsc-v1 that bench-start compares with (cached): the benchmarks use it; no test needs them.
	GO=$(GO) bash test/scripts/tools.sh bench

.PHONY: tools
tools: ## Install the node tools of tools-node, Kubernetes (apiserver, kubelet, kube-proxy, ...) and Helm into TOOLS_DIR (cached; ~35 min cold on two idle cores): make test uses it.
	GO=$(GO) bash test/scripts/tools.sh

.PHONY: chart
chart: tools ## Lint (--strict) and render the Helm chart deploy/chart/bulkhead with its default values, and package it into ./bin.
	$(TOOLS_DIR)/bin/helm lint --strict deploy/chart/bulkhead
	$(TOOLS_DIR)/bin/helm template bulkhead deploy/chart/bulkhead > /dev/null
	@mkdir -p $(BIN)
	$(TOOLS_DIR)/bin/helm package deploy/chart/bulkhead --destination $(BIN)

.PHONY: previous-release
previous-release: ## Build the previous release's shims, agent and CLI (commit in test/e2e/testdata/previous-release) for the upgrade test, cached by commit in TOOLS_DIR/prev (~1 min cold).
	@# Exit status 3: a shallow clone lacks the commit; the upgrade test skips, naming it.
	GO=$(GO) TOOLS_DIR=$(TOOLS_DIR) bash test/scripts/previous-release.sh >/dev/null || [ $$? -eq 3 ]

.PHONY: test
test: build build-failpoints tools previous-release ## Run every test: unit, Rego (with coverage gate), privileged and e2e (as root).
	@# Full verbose output goes to .test.log; the console shows each test's result and any failure.
	PATH=$(TOOLS_DIR)/bin:$$PATH BULKHEAD_BIN=$(BIN) $(GO) test -v -count=1 -timeout 30m ./... > $(CURDIR)/.test.log 2>&1; rc=$$?; \
	grep -E '^(--- (PASS|FAIL|SKIP)|ok |FAIL|panic:|\s+--- (PASS|FAIL|SKIP)|\s+[a-z_]+_test\.go:[0-9]+:)' $(CURDIR)/.test.log; \
	echo "go test exit status $$rc (full log: .test.log)"; [ $$rc -eq 0 ] || exit $$rc; \
	echo "race detector: policy evaluation shared between goroutines"; \
	$(GO) test -race -count=1 -run 'TestPlanConcurrent|TestEvalHonoursCancellation|TestRuleCacheFollowsInput|TestServerAdmissionReviews|TestReviewsWaitForACPU' ./policy/...
	@echo "fuzz: the compiled plan against OPA's interpreter on drawn inputs and data, 30 s (corpus: policy/testdata/fuzz)"
	$(GO) test -run '^$$' -fuzz '^FuzzEvaluatorsAgree$$' -fuzztime 30s ./policy
	@echo "fuzz: the plan cache's binary form of a program, damaged: an error or a program that reads back as itself, never a panic, 20 s"
	$(GO) test -run '^$$' -fuzz '^FuzzLoadBinary$$' -fuzztime 20s ./policy/irvm
	@echo "fuzz: the unsigned data file merged over a signed bundle: refused or within the signed tenants and tiers, never a panic, 10 s"
	$(GO) test -run '^$$' -fuzz '^FuzzMergeData$$' -fuzztime 10s ./policy

.PHONY: test-cluster
test-cluster: build tools ## Install Bulkhead from deploy/ on a private two-node Kubernetes cluster (kube-proxy, nodes node-a and node-b) and run the user's cases through kubectl, the traffic matrix across the nodes, a 30 s API server outage, a quota burst and MIG claims through DRA included (root; etcd from make deps).
	PATH=$(TOOLS_DIR)/bin:$$PATH BULKHEAD_BIN=$(BIN) $(GO) test -v -count=1 -timeout 25m -run '^TestCluster$$' ./test/cluster/

.PHONY: bench-cluster
bench-cluster: build tools ## Across nodes: how long after a pod of one node is Running the other node's fence holds its tenant, p50/p99 over a churn of 100 pods (root; a two-node cluster).
	PATH=$(TOOLS_DIR)/bin:$$PATH BULKHEAD_BIN=$(BIN) $(GO) test -count=1 -v -timeout 30m -run '^$$' -bench BenchmarkRemotePropagation -benchtime 1x ./test/cluster/

.PHONY: bench-quota
bench-quota: build tools ## Cluster-wide quota: Bulkhead's ConfigMap ledger against Kueue (built from source by test/scripts/kueue.sh, cached) on the same burst of 20 creates over two nodes, quota 3, 5 rounds each (root; a two-node cluster).
	GO=$(GO) TOOLS_DIR=$(TOOLS_DIR) bash test/scripts/kueue.sh
	PATH=$(TOOLS_DIR)/bin:$$PATH BULKHEAD_BIN=$(BIN) TOOLS_DIR=$(TOOLS_DIR) $(GO) test -count=1 -v -timeout 30m -run '^$$' -bench BenchmarkQuotaEngines -benchtime 1x ./test/cluster/

.PHONY: test-unit
test-unit: ## Run the unprivileged unit tests only (short mode).
	$(GO) test -short -count=1 ./...

.PHONY: vet
vet: ## go vet and gofmt check.
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi

.PHONY: demo
demo: ## Run a real local node (containerd + Bulkhead + gVisor + eBPF fence) with three tenants: `sudo make demo`.
	@if [ "$$(id -u)" != 0 ]; then echo "make demo: the node needs root (containerd, bridges, eBPF): run sudo make demo" >&2; exit 2; fi
	@$(if $(AS_USER),echo "demo: building as $(SUDO_USER) with $(GO) (tools in $(TOOLS_DIR)); only the node runs as root")
	$(AS_USER) $(if $(AS_USER),env PATH="$(dir $(GO)):/usr/local/bin:/usr/bin:/bin") $(MAKE) --no-print-directory GO=$(GO) TOOLS_DIR=$(TOOLS_DIR) build tools-node
	$(AS_USER) $(if $(AS_USER),env PATH="$(dir $(GO)):/usr/local/bin:/usr/bin:/bin") $(GO) build -o $(BIN)/demo ./test/demo
	bash test/scripts/deps.sh
	PATH=$(TOOLS_DIR)/bin:$$PATH BULKHEAD_BIN=$(BIN) $(BIN)/demo

.PHONY: demo-cluster
demo-cluster: ## Install Bulkhead on a private two-node Kubernetes cluster and show what kubectl shows at each step: `sudo make demo-cluster`.
	@if [ "$$(id -u)" != 0 ]; then echo "make demo-cluster: the cluster needs root (kubelet, containerd, cgroups, eBPF): run sudo make demo-cluster" >&2; exit 2; fi
	$(AS_USER) $(if $(AS_USER),env PATH="$(dir $(GO)):/usr/local/bin:/usr/bin:/bin") $(MAKE) --no-print-directory GO=$(GO) TOOLS_DIR=$(TOOLS_DIR) build tools
	$(AS_USER) $(if $(AS_USER),env PATH="$(dir $(GO)):/usr/local/bin:/usr/bin:/bin") $(GO) build -o $(BIN)/demo-cluster ./test/cluster/demo
	bash test/scripts/deps.sh
	PATH=$(TOOLS_DIR)/bin:$$PATH BULKHEAD_BIN=$(BIN) $(BIN)/demo-cluster

.PHONY: bench
bench: bench-policy bench-mig bench-netpol bench-webhook bench-start bench-agent ## Run every benchmark.

.PHONY: bench-policy
bench-policy: ## Benchmark policy decisions on the default bundle.
	$(GO) test -run '^$$' -bench . -benchmem ./policy/...

.PHONY: bench-mig
bench-mig: ## Benchmark MIG placement latency and print simulation figures.
	$(GO) test -run '^$$' -bench . -benchmem ./mig/...

.PHONY: bench-netpol
bench-netpol: ## Benchmark the eBPF fence per packet and over a veth pair (root).
	$(GO) test -run '^$$' -bench . -benchmem ./netpol/...

.PHONY: bench-webhook
bench-webhook: ## Benchmark the admission webhook with concurrent TLS clients.
	$(GO) test -run '^$$' -bench . -benchmem ./policy/admission/...

.PHONY: bench-start
bench-start: build build-failpoints tools-bench ## 20 pod starts through CRI each, interleaved, p50/p95: Bulkhead gVisor and runc (pipeline on, off), upstream runc-v2 and runsc-v1 shims; each shim's, the gVisor sandbox's and the agent's PSS (root).
	PATH=$(TOOLS_DIR)/bin:$$PATH BULKHEAD_BIN=$(BIN) $(GO) test -count=1 -run '^$$' -bench BenchmarkPodStart -benchtime 1x ./test/e2e/...

.PHONY: bench-agent
bench-agent: build build-failpoints tools-node ## The node agent: a decision over its socket against in-process at 100 concurrent creates, its memory with 100 pods, a bundle hot reload while pods start (root).
	$(GO) test -count=1 -run '^$$' -bench BenchmarkDecisionOverSocket -benchtime 5x ./runtime/agent/
	PATH=$(TOOLS_DIR)/bin:$$PATH BULKHEAD_BIN=$(BIN) $(GO) test -count=1 -run '^$$' -bench BenchmarkAgentMemory -benchtime 1x ./test/e2e/...
	PATH=$(TOOLS_DIR)/bin:$$PATH BULKHEAD_BIN=$(BIN) $(GO) test -count=1 -v -run '^TestBundleHotReload$$' ./test/e2e/...

# govulncheck, pinned, and the Go vulnerability database built from the
# golang.org/x/vulndb module: the module proxy is the only network these
# machines reach, and the module carries every report as OSV JSON
# (data/osv). Its own cmd/indexdb writes the index govulncheck's
# -db file:// reads. VULNDB_VERSION=latest takes the newest reports.
GOVULNCHECK_VERSION ?= v1.9.0
VULNDB_VERSION ?= latest

.PHONY: vulncheck
vulncheck: ## govulncheck ./... against the vulnerability database of the golang.org/x/vulndb module (exit 3: findings).
	@set -euo pipefail; \
	GOBIN=$(TOOLS_DIR)/bin $(GO) install golang.org/x/vuln/cmd/govulncheck@$(GOVULNCHECK_VERSION); \
	info=$$($(GO) mod download -json golang.org/x/vulndb@$(VULNDB_VERSION)); \
	ver=$$(sed -n 's/^\t"Version": "\(.*\)",$$/\1/p' <<<"$$info"); \
	src=$$(sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p' <<<"$$info"); \
	db=$(TOOLS_DIR)/vulndb/$$ver; \
	if [ ! -f "$$db/index/db.json" ]; then \
		rm -rf "$$db.tmp"; \
		$(GO) run golang.org/x/vulndb/cmd/indexdb@$$ver -vulns "$$src/data/osv" -out "$$db.tmp"; \
		mv "$$db.tmp" "$$db"; \
	fi; \
	echo "vulncheck: govulncheck $(GOVULNCHECK_VERSION), golang.org/x/vulndb $$ver, $$($(GO) env GOVERSION)"; \
	$(TOOLS_DIR)/bin/govulncheck -db "file://$$db" ./...

.PHONY: generate
generate: ## Regenerate committed generated files (eBPF objects).
	$(GO) generate ./...

.PHONY: clean
clean: ## Remove build outputs (not the tools cache).
	rm -rf $(BIN) .test.log
