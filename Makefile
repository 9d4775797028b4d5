# taskhost: a plugin host running a PostgreSQL-backed task system.
# `make` alone lists the targets. The bench (bench/) is a module of its own
# (`go ... ./...` here does not enter it): build, test, lint and tidy run
# there too.

.DEFAULT_GOAL := help
SHELL := /bin/bash

GO        ?= go
BIN       := bin
PLUGINS   := $(BIN)/plugins
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
CONFIG    ?= examples/taskhost.yaml
# make run LISTEN=127.0.0.1:9090: the host listens there (it sets TASKHOST_LISTEN), whatever CONFIG says.
LISTEN    ?= $(TASKHOST_LISTEN)
TOOLS     := $(CURDIR)/$(BIN)/tools
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
STATICCHECK_VERSION        := v0.8.2
FUZZTIME  ?= 30s

.PHONY: help
help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z0-9_\/-]+:.*## /{printf "  \033[1m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build the host and the bench (host bench) into bin/, and the plugins into bin/plugins/
	@mkdir -p $(PLUGINS)
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/host ./cmd/host
	cd bench && $(GO) build -o ../$(BIN)/taskhost-bench ./cmd/taskhost-bench
	$(GO) build -ldflags "$(LDFLAGS)" -o $(PLUGINS)/fp-plugin-tasks_worker ./plugins/tasksworker/cmd/fp-plugin-tasks_worker
	$(GO) build -ldflags "$(LDFLAGS)" -o $(PLUGINS)/fp-plugin-metrics ./plugins/metricsagg/cmd/fp-plugin-metrics
	$(GO) build -ldflags "$(LDFLAGS)" -o $(PLUGINS)/fp-plugin-example ./plugins/example/cmd/fp-plugin-example

.PHONY: run
run: build ## build, then run the host with its plugins (CONFIG=file, LISTEN=host:port: see README)
	@addr='$(LISTEN)'; \
	if [ -z "$$addr" ]; then addr=$$(sed -n 's/^listen:[[:space:]]*["'"'"']\{0,1\}\([^"'"'"'#[:space:]]*\).*/\1/p' '$(CONFIG)' | head -n 1); fi; \
	case "$$addr" in \
	'') addr=127.0.0.1:8080 ;; \
	:*) addr=127.0.0.1$$addr ;; \
	0.0.0.0:*) addr=127.0.0.1:$${addr##*:} ;; \
	'[::]':*) addr=[::1]:$${addr##*:} ;; \
	esac; \
	echo; \
	echo "  admin UI:  http://$$addr/admin/"; \
	echo "  task UI:   http://$$addr/plugin-pkg/tasks_worker/ui/"; \
	echo "  metrics:   http://$$addr/plugin-pkg/metrics/api/prometheus"; \
	echo "  tasks API: http://$$addr/plugin-pkg/tasks_worker/api/tasks"; \
	echo
	$(if $(LISTEN),TASKHOST_LISTEN='$(LISTEN)' )$(BIN)/host -config $(CONFIG)

.PHONY: test/setup
test/setup: ## install or start what the tests need (PostgreSQL, RabbitMQ, promtool, Chromium); TASKHOST_TEST_SETUP=0 skips
	@if [ "$${TASKHOST_TEST_SETUP:-1}" != 0 ]; then bash scripts/test-setup.sh; fi

.PHONY: test
test: test/setup ## run the whole test suite, the bench's too (starts PostgreSQL and RabbitMQ and installs their tools when missing)
	$(GO) test -count=1 -timeout 30m ./...
	cd bench && $(GO) test -count=1 -timeout 30m ./...

.PHONY: test/race
test/race: test/setup ## run the tests of the concurrent packages with the race detector
	$(GO) test -count=1 -race -timeout 30m ./capability/... ./client/... ./host/... ./e2e/... ./broker/... ./worker/... ./plugins/... ./reaper/... ./scheduler/...

.PHONY: chaos
chaos: build ## network chaos suite (root: network namespaces, its own PostgreSQL, a faulty proxy); see README "Chaos"
	@if [ "$$(id -u)" != 0 ]; then echo "make chaos: must run as root (it creates network namespaces): sudo make chaos"; exit 1; fi
	@command -v ip >/dev/null || { echo "make chaos: needs ip (apt-get install -y iproute2)"; exit 1; }
	@trap 'bash chaos/cleanup.sh' EXIT; \
	TASKHOST_CHAOS=1 $(GO) test -count=1 -v -timeout 14m ./chaos/ $(CHAOS_FLAGS)

.PHONY: bench
bench: ## run the Go benchmarks
	$(GO) test -run '^$$' -bench . -benchtime 3x ./...

.PHONY: fuzz
fuzz: ## run every fuzz target (func Fuzz... in a *_test.go) for FUZZTIME each (default 30s); crashers land in testdata/fuzz
	@fail=0; \
	for file in $$(grep -rl --include='*_test.go' '^func Fuzz' . | sort); do \
		pkg=$$(dirname $$file); \
		for name in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$file); do \
			echo "== $$name in $$pkg for $(FUZZTIME)"; \
			log=$$(mktemp); \
			if $(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg 2>&1 | tee $$log; test $${PIPESTATUS[0]} = 0; then :; \
			elif grep -q 'context deadline exceeded' $$log && ! grep -q 'Failing input written to' $$log; then \
				echo "== $$name: stopped by Go's fuzz deadline race (go.dev/issue/75804, fixed in Go 1.27), not by an input: ignored"; \
			else \
				fail=1; \
			fi; \
			rm -f $$log; \
		done; \
	done; \
	exit $$fail

.PHONY: lint
lint: ## gofmt, go vet and staticcheck (the bench's module too)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: the files above need formatting"; exit 1; }
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	cd bench && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

.PHONY: proto
proto: ## regenerate capability/internal/pb from the .proto files (needs protoc)
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install -y protobuf-compiler"; exit 1; }
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	PATH=$(TOOLS):$$PATH protoc -I capability/proto \
		--go_out=. --go_opt=module=github.com/taskhost/taskhost \
		--go-grpc_out=. --go-grpc_opt=module=github.com/taskhost/taskhost \
		capability/proto/taskhost/plugin/v1/plugin.proto

# The Python SDK: Debian's interpreter and packages (python3-grpcio,
# python3-protobuf, python3-cryptography), never the PATH's python3.
PYTHON    ?= /usr/bin/python3
PYSDK     := sdk/python
PYPB      := $(PYSDK)/taskhost_plugin/pb

.PHONY: proto/python
proto/python: ## regenerate the Python SDK's stubs in sdk/python/taskhost_plugin/pb (needs protoc and python3-grpc-tools)
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install -y protobuf-compiler"; exit 1; }
	@$(PYTHON) -c 'import grpc_tools.protoc' 2>/dev/null || { echo "grpc_tools not found: apt-get install -y python3-grpc-tools"; exit 1; }
	@set -e; stage=$$(mktemp -d); trap 'rm -rf "$$stage"' EXIT; \
	gp=$$($(GO) list -m -f '{{.Dir}}' github.com/hashicorp/go-plugin); \
	inc=$$($(PYTHON) -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))'); \
	mkdir -p "$$stage/taskhost_plugin/pb"; \
	cp capability/proto/taskhost/plugin/v1/plugin.proto $(PYSDK)/proto/health.proto \
		$$gp/internal/plugin/grpc_broker.proto $$gp/internal/plugin/grpc_controller.proto $$gp/internal/plugin/grpc_stdio.proto \
		"$$stage/taskhost_plugin/pb/"; \
	rm -f $(PYPB)/*_pb2.py $(PYPB)/*_pb2_grpc.py; \
	protoc -I "$$stage" -I "$$inc" --python_out=$(PYSDK) "$$stage"/taskhost_plugin/pb/*.proto; \
	$(PYTHON) -m grpc_tools.protoc -I "$$stage" -I "$$inc" --grpc_python_out=$(PYSDK) "$$stage"/taskhost_plugin/pb/*.proto; \
	echo "regenerated $(PYPB)"

.PHONY: build/python
build/python: ## pack the example Python plugin into bin/plugins/fp-plugin-pyexample (one executable file with the SDK in it)
	@mkdir -p $(PLUGINS)
	$(PYTHON) $(PYSDK)/mkplugin.py examples/python/pyexample -o $(PLUGINS)/fp-plugin-pyexample

.PHONY: test/python
test/python: ## the Python SDK's unit tests (Debian's python3, see sdk/python/README.md)
	cd $(PYSDK) && $(PYTHON) -m unittest discover -s tests -t . -v

.PHONY: tidy
tidy: ## go mod tidy (the bench's module too)
	$(GO) mod tidy
	cd bench && $(GO) mod tidy

.PHONY: clean
clean: ## remove build output
	rm -rf $(BIN)
