# shardsmith: every target sets itself up (creates .venv if missing, installs, then runs).
PYTHON ?= python3
VENV ?= .venv
# Which build this pin gives depends on what pip finds: a local CPU wheel on our CI machine; from PyPI on Linux the
# CUDA build (several GB of nvidia-* packages). CPU-only machine: make test TORCH_SPEC="torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cpu" (README.md, "Two commands").
TORCH_SPEC ?= torch==2.13.0
JOBS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install shards test test-fast lint bench bench-quick bench-scale bench-micro clean chromium

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[dev,bench,images,ct]"
	touch $(STAMP)

install: $(STAMP)

DEMOS ?= demo demo_spike demo_ct
JOBSFLAG = $(if $(JOBS),--jobs $(JOBS),)

# every demo manifest, built as zarr and as tar, then verified
shards: $(STAMP)
	$(PY) -m pipeline demo data/demo
	set -e; for m in $(DEMOS); do for f in zarr tar; do \
	  $(PY) -m pipeline build data_manifests/$$m.toml --out shards/$$m-$$f --format $$f --no-progress $(JOBSFLAG); \
	  $(PY) -m pipeline verify shards/$$m-$$f; \
	done; $(PY) -m pipeline report shards/$$m-zarr -o shards/$$m-report.html; done
	@echo "open shards/demo-report.html in a browser: the screen's report (cells per perturbation, splits, pairing)"
	@echo "next: $(VENV)/bin/shardsmith inspect shards/demo-zarr (what a dataset holds), then read it in a trainer:"
	@echo "      README.md 'Read it in a trainer' (ShardDataset(\"shards/demo-zarr\", split=\"train\", sample=\"cells\"))"

# pytest's temporary folders on tmpfs where /dev/shm is writable (TEST_TMP= keeps pytest's default):
# the tests write ~100k small files (a zarr shard is a folder) and this machine's ext4, mounted with
# discard, took ~0.4 ms to remove each one; a passing test's folder goes at its teardown, and the
# lane's whole folder (fixtures' data, ~0.1-0.3 GB of RAM) when every test passed; kept after a failure
TEST_TMP ?= $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm/pytest-lanes-$$(id -u))
TMP_ARGS = $(if $(TEST_TMP),--basetemp=$(TEST_TMP)/$@ -o tmp_path_retention_policy=failed)
TMP_DROP = $(if $(TEST_TMP),&& rm -rf $(TEST_TMP)/$@)

# on 4 xdist workers: the suite waits on servers and subprocesses as much as it computes (README, "Tests")
TEST_WORKERS ?= 4
test: $(STAMP) chromium
	$(if $(TEST_TMP),mkdir -p $(TEST_TMP))
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(TMP_ARGS) $(TMP_DROP)

# the fast lane: pure functions and in-process builds, no test that needs more (README.md, "Tests")
FAST ?= not (process or cluster or s3 or browser or gpu or root or bench)
# on 2 xdist workers (pytest-xdist): the lane is CPU-bound, ~250 CPU-s here, so 2 cores halve its wall
FAST_WORKERS ?= 2
test-fast: $(STAMP)
	$(if $(TEST_TMP),mkdir -p $(TEST_TMP))
	$(PY) -m pytest -q -n $(FAST_WORKERS) -m "$(FAST)" --ignore=tests/benchmarks $(TMP_ARGS) $(TMP_DROP)

# the browser test's Chromium (Debian's package), installed where we are root with apt-get; never fails
# the build: without it tests/pipeline/test_report_browser.py skips and says why
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && \
	    apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
	  echo "chromium not installed (needs root and apt-get): the browser test will skip"

lint: $(STAMP)
	$(PY) -m ruff check pipeline loaders tests benchmarks

bench: $(STAMP)
	$(PY) -m benchmarks.run --full --out . --torch-spec "$(TORCH_SPEC)"

# a smoke run (~2 min): small sizes check that every benchmark runs; only `make bench` judges the targets
# the build from 200k to 2M cells (~3.3 GB of sources at 2M; ~10 min on 2 idle cores): writes docs/benchmarks/SCALE.md
bench-scale: $(STAMP)
	$(PY) -m benchmarks.scale_bench

# micro-benchmarks (pytest-benchmark, tests/benchmarks/test_micro_*.py): timings side by side, no verdicts
bench-micro: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/benchmarks -k micro --benchmark-only --benchmark-group-by=group

bench-quick: $(STAMP)
	@echo "bench-quick: SMOKE RUN at small sizes (not the targets' scale; no met/missed verdicts): make bench judges the targets"
	$(PY) -m benchmarks.run --quick --out bench_data/quick

clean:
	rm -rf shards data bench_data .pytest_cache
