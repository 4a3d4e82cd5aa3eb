# Targets wrap the scripts so that the README's commands and CI stay the
# same whether or not make is installed.
FUZZTIME ?= 30s
BENCHTIME ?= 1s
BENCHCOUNT ?= 1

.PHONY: test brokers fuzz bench build

test:
	./scripts/test

brokers:
	./scripts/brokers

build:
	go build ./...

# Runs every fuzz target for FUZZTIME each (go test allows one target per run).
fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz

bench:
	BENCHTIME=$(BENCHTIME) BENCHCOUNT=$(BENCHCOUNT) ./scripts/bench
