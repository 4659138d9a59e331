# tether — `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin/tether
CONFIG ?= examples/quickstart/tether.yaml
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
GOLANGCI_VERSION := v2.15.0
BUF_VERSION := v1.75.0
BUF := $(GO) run github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
# Packages whose tests need system tools (kamailio, sipp, node) install them via `make deps`.
TEST_FLAGS ?= -race -count=1 -timeout 12m
# The deployment checks parse and render; no concurrency of ours to race.
DEPLOY_TEST_FLAGS ?= -count=1 -timeout 10m
BENCH ?= .
PKG ?= ./...
FLEET ?= 1000
# Every Go module of the repository (the root and any nested test module).
GO_MODULES := . $(patsubst %/go.mod,%,$(filter-out go.mod,$(shell git ls-files '*go.mod')))

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo
	@echo "The dashboard: http://127.0.0.1:9000/ui/ while make run or make demo runs (tether's API listener)."

.PHONY: build
build: ## Build bin/tether.
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/tether

.PHONY: run
run: build ## Run tether on the embedded store with the quick-start config (CONFIG=... to change); dashboard http://127.0.0.1:9000/ui/.
	./$(BIN) serve -c $(CONFIG)

.PHONY: demo
demo: build ## Show affinity working: tether, three sample instances and the test harness standing in for Envoy.
	$(GO) build -o bin/tether-demo ./examples/demo
	./bin/tether-demo -tether $(BIN)

.PHONY: deps
deps: ## Root: install what the tests need (Debian packages, npm packages, kube-apiserver build, Go modules), with progress.
	./.ci/deps.sh

.PHONY: test
test: deps ## Root: install the test tools (README), then every check (tidy, lint, go test -race, deploy checks); all run, summary at the end.
	@GO='$(GO)' TEST_FLAGS='$(TEST_FLAGS)' DEPLOY_TEST_FLAGS='$(DEPLOY_TEST_FLAGS)' ./.ci/checks.sh \
	  "go mod tidy (every module)" '$(MAKE) --no-print-directory tidy-check' \
	  "lint (gofmt, go vet, golangci-lint)" '$(MAKE) --no-print-directory lint' \
	  "go test -race ./..." '$(GO) test $(TEST_FLAGS) ./...' \
	  "deploy/recipetest (attachment recipes against Envoy Gateway, Istio, Inference Extension types)" 'cd deploy/recipetest && $(GO) vet ./... && $(GO) test -count=1 ./...' \
	  "100k-session snapshot round trip without -race (the race detector shrinks it to 25k)" '$(GO) test -count=1 -run TestSnapshotRoundTrip100k ./pkg/session/memstore' \
	  "deploy/test (Dockerfile, Helm, kustomize, compose, workflows)" 'cd deploy/test && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) test $(DEPLOY_TEST_FLAGS) ./...'

# Other projects' own tools, built from the module proxy by version into a cache outside the
# repository (go install pkg@version builds in the tool's own module, with its own go.mod).
EGCTL_VERSION := v1.9.1
RECIPE_TOOLS ?= $(HOME)/.cache/tether-recipes
EGCTL := $(RECIPE_TOOLS)/egctl-$(EGCTL_VERSION)/egctl

.PHONY: check-recipes
check-recipes: ## (opt-in) Build Envoy Gateway's egctl at EGCTL_VERSION (cached in RECIPE_TOOLS; the first build takes many minutes) and check its translation of deploy/envoy-gateway against tether's filter contract.
	@test -x $(EGCTL) || { echo "building egctl $(EGCTL_VERSION) into $(dir $(EGCTL))"; GOBIN=$(dir $(EGCTL)) GOFLAGS=-mod=mod $(GO) install github.com/envoyproxy/gateway/cmd/egctl@$(EGCTL_VERSION); }
	cd deploy/recipetest && TETHER_EGCTL=$(EGCTL) $(GO) test -count=1 -v -run '^TestEnvoyGatewayTranslation$$' .

.PHONY: test-loaded
test-loaded: ## make test with two CPU-burning processes beside it (#29): every test must hold on a loaded machine, waiting on conditions rather than on time. LOADED_TARGET=target to load another target.
	@pids=""; for i in 1 2; do ( while :; do :; done ) & pids="$$pids $$!"; done; \
	trap 'kill $$pids 2>/dev/null' EXIT INT TERM; \
	echo "test-loaded: burners$$pids beside make $(LOADED_TARGET)"; uptime; \
	$(MAKE) $(LOADED_TARGET); rc=$$?; uptime; exit $$rc
LOADED_TARGET ?= test

.PHONY: test-short
test-short: ## Run the tests without installing anything (skips what needs missing tools).
	$(GO) test -race -short ./...
	cd deploy/test && $(GO) test -short ./...

.PHONY: test-deploy
test-deploy: ## Only the deployment checks (Dockerfile, Helm, kustomize, compose, workflows; deploy/test).
	cd deploy/test && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) test $(DEPLOY_TEST_FLAGS) ./...

.PHONY: e2e
e2e: ## End-to-end scenarios (HTTP, MCP, SessionAPI) through the Envoy-faithful harness.
	$(GO) test -race -count=1 -timeout 10m ./internal/e2e/... ./internal/mcpe2e/... ./internal/envoyharness/...

.PHONY: e2e-envoy
e2e-envoy: ## The same scenarios through a real Envoy (>= 1.38), and the rolling restarts (three replicas on Redis, two on memdb active/standby) through one Envoy run on the bootstrap `tether bootstrap` generates for them: ENVOY_BIN=/path/to/envoy make e2e-envoy.
	@if [ -z "$(ENVOY_BIN)" ]; then echo "e2e-envoy: set ENVOY_BIN to an Envoy binary (>= 1.38)"; exit 2; fi
	ENVOY_BIN="$(ENVOY_BIN)" $(GO) test -race -count=1 -timeout 15m -run '/envoy' ./internal/e2e/... ./internal/mcpe2e/... ./pkg/api/... ./internal/replicatest/

.PHONY: bench-extproc
bench-extproc: ## ext_proc: the tether binary against a null ext_proc binary, each its own process, same driver, alternating rounds (c=1, 16, 64) (BASELINE_TETHER=/path/old-tether adds an older tether build in the same rounds: go build -o old-tether ./cmd/tether at that commit)
	EXTPROC_BENCH_BASELINE=$(BASELINE_TETHER) $(GO) test -run '^$$' -bench 'CrossProcess' -benchtime 1x -timeout 20m ./internal/extprocbench/
	$(GO) test -run '^$$' -bench 'FullDuplexCost' -benchtime 6000x ./pkg/extproc/

.PHONY: tidy
tidy: ## go mod tidy in every module.
	@for m in $(GO_MODULES); do echo "go mod tidy ($$m)"; (cd $$m && $(GO) mod tidy) || exit 1; done

.PHONY: tidy-check
tidy-check: ## Fail if any Go module's go.mod/go.sum is not tidy (`go mod tidy -diff`); make test runs it.
	@for m in $(GO_MODULES); do echo "go mod tidy -diff ($$m)"; (cd $$m && $(GO) mod tidy -diff) || { echo "not tidy: run make tidy"; exit 1; }; done

.PHONY: lint
lint: ## gofmt, go vet and golangci-lint.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION) run --allow-serial-runners ./...

.PHONY: ui
ui: ## Rebuild the dashboard (pkg/ui/web, Vite) into pkg/ui/dist, embedded in the binary; commit the result.
	cd pkg/ui/web && npm ci --no-audit --no-fund --loglevel=error && npm run build

.PHONY: generate
generate: ## Regenerate pkg/api/gen from proto/ (buf with local protoc-gen-go / protoc-gen-go-grpc) and deploy/filter-contract.json from pkg/wire.
	$(BUF) generate
	$(GO) test -count=1 -run '^TestFilterContractFile$$' ./pkg/wire -update

.PHONY: proto-lint
proto-lint: ## buf lint, and the breaking-change check against the main branch.
	$(BUF) lint
	$(BUF) breaking --against '.git#branch=main'

.PHONY: verify-generate
verify-generate: generate ## Fail if regenerating changes anything committed.
	git diff --exit-code -- pkg/api/gen deploy/filter-contract.json
	@test -z "$$(git status --porcelain -- pkg/api/gen deploy/filter-contract.json)" || { git status --porcelain -- pkg/api/gen deploy/filter-contract.json; exit 1; }

.PHONY: bench-xds
bench-xds: ## xDS: one change to one client vs a textbook full snapshot, then a fleet of 1,000 ADS clients in their own process (FLEET=n to change: 10000 takes a few minutes; ~4 min). OLD=/path/old.test runs an older build's fleet in the same rounds (go test -c -o old.test ./pkg/xds at that commit); ROUNDS='1 2' to repeat.
	@bin=$$(mktemp -d)/xds.test && $(GO) test -c -o $$bin ./pkg/xds/ && \
	$$bin -test.run '^$$' -test.bench 'RegistryChangeToClient/one-endpoint$$|BaselineFullSnapshot' -test.benchtime 200x -test.benchmem && \
	for i in $(or $(ROUNDS),1); do for b in $$bin $(OLD); do \
		uptime; echo "$$b:"; \
		TETHER_FLEET_CLIENTS=$(FLEET) $$b -test.run '^$$' -test.bench 'XDSFleet' -test.benchtime 10x -test.benchmem -test.timeout 30m | grep -E '^Benchmark|clients:'; \
	done; done; uptime

.PHONY: bench-curves
bench-curves: ## Cost curves as SVG plots in docs/perf/ (data in docs/perf/data/): Decide over a shuffled walk of 1k-1M sessions beside its baselines, heap per live session, xDS CPU per connect and heap per client for 1-1,000 clients (CURVES_SESSIONS, CURVES_MEMORY, CURVES_CLIENTS to change; OLD_XDS=/path/old.test draws an older build beside; ~10 min). Redraw only: go run ./internal/benchcurves docs/perf/data/*.tsv
	GO=$(GO) internal/benchcurves/collect.sh

.PHONY: bench-sessions-10m
bench-sessions-10m: ## Heap of 10M live cookie sessions made through the engine (outside CI: ~1.4 GB of heap, 145 B a session measured; tens of minutes on 2 cores). GOMEMLIMIT=8GiB: a store that does not fit in 8 GB thrashes instead of passing.
	GOMEMLIMIT=8GiB TETHER_LIVE_SESSIONS=10000000 $(GO) test -run '^$$' -bench 'LiveSessionMemory' -benchtime 1x -timeout 240m ./pkg/affinity/

.PHONY: bench
bench: ## Run the benchmarks (BENCH=regex PKG=./pkg/x to narrow; all of them take ~20 min, the 1M-session memory ones most; SIP decision over HTTP vs a trivial server, each its own process: BENCH=DecideVsTrivialHTTP PKG=./pkg/sipdecide, parse fast path vs sipgo's full parser: BENCH='SIPParse' PKG=./pkg/dcr).
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -count 1 $(PKG)

.PHONY: bench-replicas
.PHONY: rolling
rolling: ## The rolling restart at full size (TETHER_ROLLING=full: 300 long streams, 30 cookie and 30 header request loops, 30 probes on a 12-slot instance) on Redis (3 replicas) and memdb active/standby (2), with its numbers (~5 min).
	TETHER_ROLLING=full $(GO) test -count=1 -timeout 30m -run 'TestRollingRestartOn' -v ./internal/replicatest/ | grep -E 'rolling_test.go|^ +[0-9]+ × |--- |^(ok|FAIL)'; uptime

.PHONY: upgrade
upgrade: ## The rolling upgrade from the build at commit OLD (default e11d6a0, built once from the git history into ~/.cache/tether/builds) to this tree's, at the rolling restart's full size on one redis-server: three old replicas replaced one at a time, mixed versions for over 60 s; cap, sessions and where the failures fall asserted (~4 min, plus the old build the first time).
	TETHER_UPGRADE_FROM=$(or $(OLD),e11d6a0) TETHER_ROLLING=full $(GO) test -count=1 -timeout 40m -run 'TestRollingUpgradeFromOld' -v ./internal/replicatest/ | grep -E 'upgrade_test.go|rolling_test.go|^ +[0-9]+ × |--- |^(ok|FAIL)'; uptime

.PHONY: faults
faults: ## The long Redis fault schedules (tether serve's leaseTTL 10 s and degradedFor 15 s; Redis down 1-60 s with AOF, without, restarted empty; SIGSTOP 10 s; one replica partitioned 15 and 30 s), each row of the faults table; then ackDurability: 20 redis-server kill -9s with a busy disk (none on everysec, aof) and 10 Sentinel failovers (none, replica), acknowledged sessions lost; then Redis Cluster: sessions per primary, new-session rate vs one redis-server, 5 primary failovers per mode (none, replica) (~25 min).
	TETHER_FAULTS=long $(GO) test -count=1 -timeout 60m -run 'TestFaultSchedules' -v ./internal/replicatest/ | grep -E '^\s+schedule_test.go:[0-9]+: \||--- |^(ok|FAIL)'
	TETHER_FAULTS=long $(GO) test -count=1 -timeout 30m -run 'TestAckDurability' -v ./internal/replicatest/ | grep -E '^\s+durability_test.go:[0-9]+: \||--- |^(ok|FAIL)'
	TETHER_FAULTS=long $(GO) test -count=1 -timeout 30m -run 'TestClusterLayout|TestClusterFailoverUnderLoad' -v ./internal/replicatest/ | grep -E '^\s+cluster_test.go:[0-9]+: \||--- |^(ok|FAIL)'; uptime

bench-replicas: ## Decide on the Redis store (one replica, real redis-server) against memdb, existing and new sessions, with the Redis commands each costs; six alternating rounds (~3 min). OLD=/path/old.test adds an older build in the same rounds, each line ending with its binary (go test -c -o old.test ./internal/replicatest/ at that commit); ROUNDS='1 2' to change the rounds.
	@bin=$$(mktemp -d)/replicatest.test && $(GO) test -c -o $$bin ./internal/replicatest/ && \
	for i in $(or $(ROUNDS),1 2 3 4 5 6); do for b in $$bin $(OLD); do \
		$$b -test.run '^$$' -test.bench 'ReplicaDecideExistingSession' -test.benchtime 1000000x -test.benchmem | grep Benchmark | sed "s|\$$| $$b|"; \
		$$b -test.run '^$$' -test.bench 'ReplicaDecideNewSession' -test.benchtime 20000x -test.benchmem | grep Benchmark | sed "s|\$$| $$b|"; \
	done; done; uptime

.PHONY: bench-durability
bench-durability: ## New-session latency (p50, p99) with each store.redis.ackDurability side by side on one redis-server pair: none on appendfsync everysec and always, aof (always), replica (WAIT 1); three rounds, each running the four in turn (~1 min).
	@bin=$$(mktemp -d)/replicatest.test && $(GO) test -c -o $$bin ./internal/replicatest/ && \
	for i in 1 2 3; do \
		$$bin -test.run '^$$' -test.bench 'AckDurabilityNewSession' -test.benchtime 2000x | grep Benchmark; \
	done; uptime

.PHONY: bench-decide
bench-decide: ## Decide against its baselines: a new session vs a one-index go-memdb insert (goal <= 1.5x), an existing session vs a bare go-memdb First (<= 0.5x) and vs a Go map lookup + atomic add (<= 3x), each walking a shuffled sequence of the same number of sessions (TETHER_DECIDE_SESSIONS, default 1000); six rounds, each pair in one process with the same iteration count (both tables grow alike), wall and CPU ratios (~3 min). OLD=/path/old.test adds an older build in the same rounds (go test -c -o old.test ./pkg/affinity at that commit).
	@bin=$$(mktemp -d)/affinity.test && $(GO) test -c -o $$bin ./pkg/affinity/ && \
	for i in $(or $(ROUNDS),1 2 3 4 5 6); do for b in $$bin $(OLD); do \
		for pair in 'DecideNewSession BaselineMemdbInsert 100000x' 'DecideExistingSession BaselineMemdbFirst 200000x' 'DecideExistingSession BaselineMapAtomic 200000x'; do \
			set -- $$pair; \
			$$b -test.run '^$$' -test.bench "^Benchmark($$1|$$2)\$$" -test.benchtime $$3 -test.benchmem | \
			awk -v a=$$1 -v z=$$2 -v bin=$$b '/^Benchmark/ { n=$$1; sub(/^Benchmark/, "", n); sub(/-[0-9]+$$/, "", n); ns[n]=$$3; cpu[n]=$$5; al[n]=$$9 } \
				END { printf "%s/%s: wall %.2fx cpu %.2fx (%s ns %s cpu-ns %s allocs; %s ns %s cpu-ns %s allocs) %s\n", a, z, ns[a]/ns[z], cpu[a]/cpu[z], ns[a], cpu[a], al[a], ns[z], cpu[z], al[z], bin }'; \
		done; \
	done; done; uptime

.PHONY: bench-sip
bench-sip: ## SIP decision CPU vs a trivial net/http server, and the call-load and failover endpoints' CPU, each server its own process (BASELINE=/path/old.test adds an older build's server in alternating rounds: go test -c -o old.test ./pkg/sipdecide at that commit)
	TETHER_SIPDECIDE_BENCH_BASELINE=$(BASELINE) $(GO) test -run '^$$' -bench 'DecideVsTrivialHTTP|CallEndpointsHTTP' -benchtime 20x -count 3 ./pkg/sipdecide/

# Every fuzz target, as package:Target, found in the sources (every `func Fuzz…` in a
# _test.go file under pkg/, cmd/ and internal/), so a new target is never left out. Their
# seed corpora (f.Add seeds and testdata/fuzz) run in every `go test`, so `make test`
# replays them.
FUZZ_TARGETS := $(shell grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' pkg cmd internal | sed -E 's|^(.*)/[^/]*:func (Fuzz.*)|./\1:\2|' | sort)
# FUZZTIME is per target: a duration (30s, 10m) or an execution count (1000000x).
FUZZTIME ?= 30s
FUZZ_FLAGS ?= -fuzzminimizetime 5s -parallel 1
# Fuzzing is long and CPU-bound: it runs at the lowest priority, one target at a time.
FUZZ_NICE ?= nice -n 19

.PHONY: fuzz
fuzz: ## Run every fuzz target in turn for FUZZTIME each (default 30s; e.g. FUZZTIME=10m or FUZZTIME=1000000x), niced; stops at the first failure.
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "== $$pkg $$name ($(FUZZTIME))"; \
		$(FUZZ_NICE) $(GO) test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $(FUZZ_FLAGS); \
	done

.PHONY: fuzz-list
fuzz-list: ## List every fuzz target as package:Target.
	@for t in $(FUZZ_TARGETS); do echo $$t; done

.PHONY: clean
clean: ## Remove build output.
	rm -rf bin
