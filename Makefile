# Two commands on a fresh machine: `make tune` (set up, tune the default model, a short
# comparison against the vendor libraries) and `make test` (set up, run the checks and the
# test suite: what CI runs). `make bench` regenerates results/cpus/<mcpu>/gemm_vs_vendor.* in full.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
QUICK := results/quick/gemm_vs_vendor

.PHONY: setup tools tune bench test lint clean

# pip shows downloads as they go but nothing while it unpacks (torch: about 40 s), so a
# line every 15 s says the install is still running
$(STAMP): pyproject.toml
	@echo "== setting up $(VENV): about a minute on a 2-core machine"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@$(BIN)/pip install -e ".[dev]" & pid=$$!; start=$$(date +%s); \
	while sleep 1 && kill -0 $$pid 2>/dev/null; do \
	  t=$$(($$(date +%s) - start)); [ $$((t % 15)) -ne 0 ] || \
	  echo "   pip is still installing: $$t s so far, about 60 s in all"; \
	done; wait $$pid
	touch $(STAMP)

setup: $(STAMP) tools

# llvm-mca (Debian's llvm-19) for tests/test_static_loop.py, which skips without it:
# installed only by root through apt-get, best effort (never fails for want of it)
tools:
	@command -v llvm-mca-19 >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  command -v apt-get >/dev/null 2>&1 && export DEBIAN_FRONTEND=noninteractive && \
	  { apt-get install -y -q --no-install-recommends llvm-19 >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && \
	      apt-get install -y -q --no-install-recommends llvm-19 >/dev/null 2>&1; }; }; } || \
	  echo "   llvm-mca-19 not installed: tests/test_static_loop.py skips without llvm-mca"

# quick tune of llama-160m (about 2 min), then its GEMMs against numpy, torch and OpenVINO
# at a few M, one pass, decode rows also with weights streamed from DRAM (about 3 min)
tune: $(STAMP)
	$(BIN)/sandwichc tune --budget quick
	$(BIN)/sandwichc bench gemm --m 1,8,64,512 --passes 1 \
		--json $(QUICK).json --md $(QUICK).md --png $(QUICK).png

# the published comparison: both models tuned on the default budget, every M, three passes
# minutes apart (about 75 min on a 2-core machine; tuning is skipped where the cache has it)
bench: $(STAMP)
	$(BIN)/sandwichc tune --model llama-160m --plan off
	$(BIN)/sandwichc tune --model sheared-llama-1.3b --plan off
	$(BIN)/sandwichc bench gemm --model llama-160m --model sheared-llama-1.3b --passes 3

lint: $(STAMP)
	$(BIN)/ruff check sandwich compiler dsl tuner topology runtime bench tests

# two pytest-xdist workers, a test file each at a time (its module fixtures built once), the
# slowest files first (tests/conftest.py: SLOW_FIRST); the kernels the tests tune, and every
# kernel they compile, land in directories the workers share; the 15 slowest tests are
# listed at the end, to keep the suite under its 15 minutes. Their temp files go to /dev/shm
# where it is a writable RAM file system with 4 GiB free and TMPDIR is unset: the tests write
# tens of thousands of small files (hwloc snapshots, kernel builds), which took 6-8x as long
# on this VM's disk (tests/test_topology_hwloc*.py: 104 s there, 27 s in RAM)
TEST_TMP := $(shell d=/dev/shm; [ -z "$$TMPDIR" ] && [ -d $$d ] && [ -w $$d ] && \
	[ "$$(df -Pk $$d 2>/dev/null | awk 'NR == 2 {print $$4}')" -ge 4194304 ] 2>/dev/null && echo $$d)
test: $(STAMP) tools lint
	$(if $(TEST_TMP),TMPDIR=$(TEST_TMP) )$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests

clean:
	rm -rf $(VENV) build *.egg-info
