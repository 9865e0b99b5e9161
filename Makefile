# iop — make run / make test are the two commands a new user needs.
GO          ?= go
BIN         := bin
PKG         := ./...
# The longest test packages, listed first so that go test starts them first
# and the short ones fill the other core meanwhile: started last (in
# ./...'s order), the end-to-end suite alone was the last minutes of the run.
SLOW_PKGS   := ./test/e2e/ ./test/agentcli/ ./adapters/transport/ ./adapters/store/edgestore/ ./adapters/store/sqlite/
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -X iop/bootstrap.Version=$(VERSION) -X main.version=$(VERSION)
PROTOC_GEN_GO_VERSION := v1.36.12
STATICCHECK_VERSION   := v0.8.2

.PHONY: all build run test test-unit test-e2e bench bench-compare frp lint fmt proto clean agent-clis agent-clis-if-npm

all: build

## build: the three binaries into bin/ (pure Go, CGO_ENABLED=0)
build:
	@echo "building bin/iop-edge, bin/iop-node, bin/iop (a first build downloads and compiles the dependencies: a few minutes on a slow machine)"
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/iop-edge ./cmd/iop-node ./cmd/iop

## run: build, start an edge + local node from configs/, stream a sample run, serve until Ctrl-C
run: build
	./scripts/run.sh

# The race detector needs cgo and a C compiler. Without one, tests still run,
# without -race, and say so.
HAVE_CC     := $(shell command -v $$($(GO) env CC) >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_CC),yes)
RACE        := CGO_ENABLED=1
RACEFLAG    := -race
else
RACE        := CGO_ENABLED=0
RACEFLAG    :=
endif

# PostgreSQL's binaries: the store suites start a throwaway server with them.
HAVE_PG     := $(shell ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 && echo yes)

## test: every test — unit and end to end — under the race detector; the
## store suites also run on a throwaway PostgreSQL when it is installed
# The real agent CLIs (claude, codex, gemini) the agent e2e tests drive,
# installed with npm at pinned versions outside the repository.
AGENT_CLIS  := $(or $(IOP_AGENT_CLIS),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/iop/agent-clis)
export IOP_AGENT_CLIS := $(AGENT_CLIS)
HAVE_NPM    := $(shell command -v npm >/dev/null 2>&1 && echo yes)

## agent-clis: install the pinned claude, codex and gemini CLIs into $(AGENT_CLIS) (needs npm)
agent-clis:
	./scripts/agent-clis.sh

agent-clis-if-npm:
ifeq ($(HAVE_NPM),yes)
	@./scripts/agent-clis.sh || echo "warning: installing the agent CLIs failed; the real-CLI agent tests will skip"
else
	@echo "note: npm not found; the real-CLI agent tests (test/e2e TestAgent*) will skip (apt-get install -y nodejs npm, then make agent-clis)"
endif

## test: every test — unit and end to end — under the race detector
test: agent-clis-if-npm
	@[ -n "$(RACEFLAG)" ] || echo "warning: no C compiler ($$($(GO) env CC)); running without the race detector (apt-get install gcc)"
	@[ -n "$(HAVE_PG)" ] || echo "warning: PostgreSQL not installed; skipping the PostgreSQL store and e2e runs (apt-get install -y postgresql)"
	$(RACE) $(GO) test $(RACEFLAG) -count=1 -timeout 15m $(SLOW_PKGS) $$($(GO) list $(PKG) | grep -v -x $(SLOW_PKGS:./%/=-e iop/%))

## test-unit: everything except the end-to-end suite
test-unit:
	$(RACE) $(GO) test $(RACEFLAG) -count=1 $$($(GO) list ./... | grep -v /test/e2e)

## test-e2e: real iop-edge / iop-node / iop processes on loopback
test-e2e: agent-clis-if-npm
	$(GO) test -count=1 -timeout 10m ./test/e2e/...

## bench: transport and tunnel benchmarks (ratios in docs/benchmarks.md)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./adapters/transport/ ./test/e2e/...

## lint: gofmt, go vet, staticcheck, the hexagon's import rules (test/arch)
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKG)
	$(GO) vet -tags load ./test/e2e/
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $(PKG)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -tags load ./test/e2e/
	$(GO) test -count=1 ./test/arch/

fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

## proto: regenerate proto/iop/*.pb.go (needs protoc: apt-get install protobuf-compiler)
proto:
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install -y protobuf-compiler"; exit 1; }
	GOBIN=$(CURDIR)/$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	PATH=$(CURDIR)/$(BIN):$$PATH protoc -I proto --go_out=. --go_opt=module=iop proto/iop/runtime.proto

clean:
	rm -rf $(BIN) tmp

# frp (frps + frpc), the relay the load tool compares iop with, built from
# the Go module proxy at a pinned version into a cache outside the repository
# (never vendored, never in go.mod).
FRP_VERSION := v0.61.0
FRP_DIR     := $(or $(IOP_FRP_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/iop/frp-$(FRP_VERSION))
export IOP_FRP_DIR := $(FRP_DIR)

## frp: build frps and frpc $(FRP_VERSION) into $(FRP_DIR) (once; the load tool's frp column)
frp:
	FRP_VERSION=$(FRP_VERSION) GO=$(GO) ./scripts/frp.sh

## bench-compare: load tool — direct vs frp vs a real edge + node, side by side (issue 10; docs/benchmarks.md)
## (IOP_LOAD_MODES=auto|off, IOP_LOAD_ROUNDS=N, IOP_LOAD_PARTS=tunnel|runs, IOP_LOAD_PPROF=DIR, IOP_LOAD_PPROF_SECONDS=N,
##  IOP_LOAD_SYSCALLS=1 (perf stat), IOP_LOAD_RELAY_GOMAXPROCS=N)
bench-compare:
	@$(MAKE) --no-print-directory frp || echo "warning: building frp failed (no network?); the load tool will skip its frp column"
	$(GO) test -tags load -run TestLoadCompare -count=1 -timeout 10m -v ./test/e2e/

# The web console's browser tests (test/e2e/console_test.go) skip without
# Chromium; make test says so up front.
ifneq ($(filter test test-e2e,$(MAKECMDGOALS)),)
ifeq ($(IOP_CHROMIUM)$(shell command -v chromium chromium-browser google-chrome google-chrome-stable headless-shell 2>/dev/null),)
$(info note: no chromium; the web console's browser tests will skip (apt-get install chromium))
endif
endif
