# SPDX-License-Identifier: Apache-2.0
# Convenience targets over CMake. The README's commands are ./quickstart and ./quickstart test.
BUILD ?= build
JOBS ?= 2

.PHONY: all build test test-unit test-asan test-valgrind fuzz bench chaos chaos-matrix chaos-matrix-kafka chaos-smoke chaos-soak clean format format-check
all: build
build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
test: build
	cd $(BUILD) && ctest --output-on-failure -j 2 -LE 'fuzz|long'
test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j 2 -L unit
test-asan:
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DONCEQ_SANITIZE=ON >/dev/null
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ctest --output-on-failure -j 2 -L unit
test-valgrind: build
	for t in $(BUILD)/test_*; do echo "== $$t"; ONCEQ_TESTDATA=$(CURDIR)/tests/data \
	  valgrind -q --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=1 $$t \
	  || exit 1; done
fuzz:
	CC=clang cmake -S . -B $(BUILD)-fuzz -DCMAKE_BUILD_TYPE=Debug -DONCEQ_FUZZ=ON >/dev/null
	cmake --build $(BUILD)-fuzz -j $(JOBS)
	for f in $(notdir $(basename $(wildcard tests/fuzz/fuzz_*.c))); do mkdir -p $(BUILD)-fuzz/fuzz-corpus/$$f; \
	  $(BUILD)-fuzz/$$f -max_total_time=$${FUZZ_SECONDS:-120} -rss_limit_mb=2048 \
	  $(BUILD)-fuzz/fuzz-corpus/$$f tests/fuzz/corpus/$$f || exit 1; done
chaos: build
	cd $(BUILD) && ctest --output-on-failure -L 'chaos|long'
# The chaos matrix (docs/CHAOS.md): every scenario CHAOS_RUNS times from a printed seed;
# results in results/<stamp>/ (report.md, report.json, recovery.svg). CHAOS_DB=pg runs it on
# PostgreSQL (a fresh database per run on ONCEQ_TEST_PG_URL, else a private scripts/pg.sh cluster).
CHAOS_RUNS ?= 3
CHAOS_SCENARIOS ?= all
chaos-matrix: build
	python3 chaos/run.py --build $(BUILD) --runs $(CHAOS_RUNS) --scenarios $(CHAOS_SCENARIOS) \
	  $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) $(if $(CHAOS_MINUTES),--minutes $(CHAOS_MINUTES)) \
	  $(if $(CHAOS_DB),--db $(CHAOS_DB))
# The real-Kafka row (7b, kafka_node_faults): node kill -9 / restart and SIGSTOP on one 3-node
# KRaft cluster started for its runs (java 17+, kcat, the jars of scripts/kafka-fetch.sh);
# without them the row is reported as skipped (exit 77), never as passed.
chaos-matrix-kafka: build
	python3 chaos/run.py --build $(BUILD) --real-kafka --scenarios kafka_node_faults \
	  --runs $(CHAOS_RUNS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) \
	  $(if $(CHAOS_MINUTES),--minutes $(CHAOS_MINUTES))
chaos-smoke: build
	python3 chaos/run.py --build $(BUILD) --smoke --runs 1 --soak-minutes 0.5 \
	  $(if $(CHAOS_DB),--db $(CHAOS_DB))
# The soak alone: SOAK_MINUTES of load with a kill -9 every 2-6 s, RSS and descriptors sampled.
SOAK_MINUTES ?= 10
chaos-soak: build
	python3 chaos/run.py --build $(BUILD) --scenarios soak --runs 1 --soak-minutes $(SOAK_MINUTES) \
	  $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))
bench: build
	bash bench/run.sh $(BUILD)/onceq   # runs $(BUILD)/onceq-bench
clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz
format:
	clang-format -i $$(git ls-files "*.c" "*.h")
format-check:
	clang-format --dry-run --Werror $$(git ls-files "*.c" "*.h")
