# Targets wrap the scripts so that the README's commands and CI stay the
# same whether or not make is installed.
FUZZTIME ?= 30s
BENCHTIME ?= 1s
BENCHCOUNT ?= 1
# The version the binary reports. git describe names the commit even where
# the go command records none (a linked worktree, -buildvcs=false); empty
# (no git) leaves the build information to speak.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)

.PHONY: test brokers demo fuzz bench bench-bridge build compile chaos compose-test

test:
	./scripts/test

brokers:
	./scripts/brokers

# The fault suite's full matrix (docs/RELIABILITY.md); scripts/test runs a
# short subset.
chaos:
	./scripts/chaos

# docker-compose.yml for real, with images built here (docs/OPERATIONS.md,
# "Running the compose file in the tests"); scripts/test runs it last.
compose-test:
	./scripts/compose-test

# The README's first command: the bridge on embedded brokers, needing none.
# It is its own command so that ./connector links no broker.
demo:
	go run ./cmd/connector-demo

# Compiles every package, then links ./connector.
build: compile
	go build -ldflags "-X main.version=$(VERSION)" -o connector ./cmd/connector

compile:
	go build ./...

# Runs every fuzz target for FUZZTIME each (go test allows one target per run).
fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz

bench:
	BENCHTIME=$(BENCHTIME) BENCHCOUNT=$(BENCHCOUNT) ./scripts/bench

# The bridge's cost against the direct rigs, all six bridged rigs in paired
# rounds; BENCHFLAGS passes flags (e.g. "-rounds 7 -json run.json").
bench-bridge:
	./scripts/bench-bridge $(BENCHFLAGS)
