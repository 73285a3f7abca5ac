# kwq: the two commands of the README, plus helpers.
#   make run   - install missing Debian packages, build Release, run the main job
#   make test  - the same set-up, then every test: ASan+UBSan (gcc, Debug), TSan (gcc),
#                clang with -Wthread-safety -Werror, and the libFuzzer fuzzers for a
#                bounded time
JOBS ?= 2
CMAKE_GEN := -G Ninja
CTEST := ctest --output-on-failure -j$(JOBS) --timeout 120

.PHONY: run test setup release asan tsan clang fuzz soak wake-stress bench scenarios plots clean format

setup:
	@bash scripts/setup.sh

release: setup
	@cmake -S . -B build/release $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release -DKWQ_BUILD_TESTS=OFF \
	  -DKWQ_PROMETHEUS=ON >/dev/null
	@cmake --build build/release -j$(JOBS)

run: release
	./build/release/examples/controller_example
	./build/release/examples/workqueue_example
	./build/release/examples/context_timer_example
	./build/release/examples/prometheus_example

asan: setup
	cmake -S . -B build/asan $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=g++ \
	  -DKWQ_SANITIZE=address,undefined -DKWQ_INSTALL_TEST=ON -DKWQ_PROMETHEUS=ON -DKWQ_WERROR=ON -DKWQ_BUILD_BENCHMARKS=OFF >/dev/null
	cmake --build build/asan -j$(JOBS)
	cd build/asan && LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp $(CTEST)

tsan: setup
	cmake -S . -B build/tsan $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=g++ \
	  -DKWQ_SANITIZE=thread -DKWQ_PROMETHEUS=ON -DKWQ_WERROR=ON -DKWQ_BUILD_BENCHMARKS=OFF -DKWQ_BUILD_TOOLS=OFF >/dev/null
	cmake --build build/tsan -j$(JOBS)
	cd build/tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" $(CTEST)

clang: setup
	cmake -S . -B build/clang $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ \
	  -DKWQ_THREAD_SAFETY=ON -DKWQ_PROMETHEUS=ON >/dev/null
	cmake --build build/clang -j$(JOBS)
	cd build/clang && $(CTEST)

# libFuzzer, model-based: each fuzzer runs FUZZ_SECONDS on the seed corpus in fuzz/corpus.
FUZZ_SECONDS ?= 10
fuzz: setup
	cmake -S . -B build/fuzz $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
	  -DKWQ_SANITIZE=address,undefined -DKWQ_FUZZ=ON -DKWQ_BUILD_TESTS=OFF -DKWQ_BUILD_BENCHMARKS=OFF \
	  -DKWQ_BUILD_TOOLS=OFF >/dev/null
	cmake --build build/fuzz -j$(JOBS)
	for f in queue_fuzz context_fuzz delaying_queue_fuzz rate_limiter_fuzz rate_limiting_queue_fuzz workqueue_fuzz priority_sharded_fuzz; do \
	  mkdir -p build/fuzz/corpus/$$f && \
	  if ./build/fuzz/fuzz/$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	      build/fuzz/corpus/$$f fuzz/corpus/$$f > build/fuzz/$$f.log 2>&1; then \
	    echo "$$f: $$(grep -E 'number_of_executed_units|new_units_added' build/fuzz/$$f.log | tr '\n' ' ')"; \
	  else tail -40 build/fuzz/$$f.log; echo "$$f FAILED"; exit 1; fi; \
	done

test: asan tsan clang fuzz

bench: release
	bash bench/run_benchmarks.sh

scenarios: release
	bash bench/run_scenarios.sh

# The long soak (make test runs a 2 s one in every build, TSan included).
SOAK_SECONDS ?= 60
soak: release
	@cmake --build build/release -j$(JOBS) --target kwq-soak
	./build/release/tools/kwq-soak --seconds=$(SOAK_SECONDS)

# Hunts lost wake-ups in Queue's wake-up protocol (tests/wake_stress.cc); not part of
# make test. Run it after changing NeedWakeLocked / Spin / TryGet.
ROUNDS ?= 100000
wake-stress: setup
	@cmake -S . -B build/release-tests $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release -DKWQ_BUILD_TESTS=ON \
	  -DKWQ_BUILD_BENCHMARKS=OFF >/dev/null
	@cmake --build build/release-tests -j$(JOBS) --target kwq-wake-stress
	./build/release-tests/tests/kwq-wake-stress --rounds=$(ROUNDS)

# Regenerates docs/img/*.png from docs/data/ (raw results of `make bench` and `make scenarios`).
plots:
	@bash scripts/setup.sh python3-matplotlib
	/usr/bin/python3 docs/plot.py

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf build
