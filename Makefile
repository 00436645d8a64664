# Set-up is two commands: `make run` and `make test` (README.md).
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
export CHESSD_ENGINES_DIR ?= $(HOME)/.cache/chessd/engines

GO       ?= go
BIN      := bin/chessd
FUZZTIME ?= 20s
# make test runs every fuzz target this long after the unit tests (about 10 targets).
# A count, not a duration: Go 1.26's fuzzer can fail a target with "context deadline
# exceeded" when a duration ends while a worker is busy (golang/go#75804, fixed in 1.27).
TEST_FUZZTIME ?= 3000x

.PHONY: all build run test engines chromium web lint-openapi vet bench fuzz clean generate screenshots

all: build

build: web
	$(GO) build -o $(BIN) ./cmd/chessd

# The front-end assets embedded in the binary: `npm ci` from web/package-lock.json (exact
# versions), then Redoc's standalone bundle copied into openapi/assets for the reference
# page (/v1/docs). Each step runs only when its inputs changed.
REDOC_JS := openapi/assets/redoc.standalone.js
web: $(REDOC_JS)

web/node_modules/.package-lock.json: web/package.json web/package-lock.json
	cd web && npm ci --no-audit --no-fund --loglevel=error

$(REDOC_JS): web/node_modules/.package-lock.json
	cp web/node_modules/redoc/bundles/redoc.standalone.js $@

# The web console (web/console → console/dist, embedded by package console): bundled by
# the pinned esbuild, index.html last, so it stands for the whole build.
CONSOLE_INDEX := console/dist/index.html
web: $(CONSOLE_INDEX)

$(CONSOLE_INDEX): web/node_modules/.package-lock.json $(wildcard web/console/*)
	cd web && node console/build.mjs

# The browser the console's end-to-end tests drive (Debian's chromium); a no-op when present.
chromium:
	@bash scripts/install-chromium.sh

# Lints the OpenAPI document with the pinned @redocly/cli (offline: telemetry off).
lint-openapi: web
	REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
	  npx --prefix web --no -- redocly lint --format=stylish --config openapi/redocly.yaml openapi/openapi.yaml

# Regenerates the Go client (client/client.gen.go) from openapi/openapi.yaml with the
# oapi-codegen pinned in go.mod's `tool` directive; client/generate_test.go fails while
# the committed file differs from a fresh generation.
generate:
	$(GO) generate ./client

# Installs the engines once per machine into $(CHESSD_ENGINES_DIR); a no-op when present.
engines:
	@bash scripts/install-engines.sh

# Builds, installs engines if missing, brings up PostgreSQL (embedded unless
# DATABASE_URL is set), migrates and serves on :$${PORT:-8080} under /v1.
run: build engines
	./$(BIN) serve

vet: web
	$(GO) vet ./...
	$(GO) build ./...

# Real PostgreSQL (a private throw-away cluster per test binary unless DATABASE_URL is
# set) and real engines, every exchange checked against the OpenAPI document; then
# every fuzz target for TEST_FUZZTIME.
test: engines chromium web vet lint-openapi
	$(GO) test -count=1 -timeout 30m ./...
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(TEST_FUZZTIME)

# Retakes docs/screenshots with the console's browser test (make test takes them into
# a temporary directory).
screenshots: engines chromium web
	CHESSD_SCREENSHOTS=1 $(GO) test -count=1 -run TestConsole ./console/

# Runs each fuzz target for FUZZTIME (one package's targets one after another: go test
# fuzzes one target at a time). Inputs that fail are kept in testdata/fuzz.
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; done

# Go benchmarks, then the load driver on loopback (raw Stockfish vs the service, the
# service vs a trivial Go JSON handler). Results go to bench.out; docs/BENCHMARKS.md
# quotes them. BENCHFLAGS go to chessbench (e.g. -parts cached -cpuprofile cpu.prof).
bench: build engines
	@command -v wrk >/dev/null || { apt-get install -y wrk >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y wrk >/dev/null; }; }
	@set -o pipefail; { \
	  $(GO) test -run '^$$' -bench . -benchtime 40x ./engine/ ./domain/... ./commands/ ./httpapi/ && \
	  $(GO) run ./cmd/chessbench $(BENCHFLAGS); } | tee bench.out

clean:
	rm -rf bin
