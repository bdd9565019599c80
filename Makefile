# shardsmith: every target sets itself up (creates .venv if missing, installs, then runs).
PYTHON ?= python3
VENV ?= .venv
# The local CPU build; an unpinned torch pulls several GB of CUDA packages. Override: make test TORCH_SPEC=torch==2.5.1
TORCH_SPEC ?= torch==2.13.0
JOBS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install shards test lint bench bench-quick clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[dev,bench,images]"
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
	done; done

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check pipeline loaders tests benchmarks

bench: $(STAMP)
	$(PY) -m benchmarks.run --full --out .

bench-quick: $(STAMP)
	$(PY) -m benchmarks.run --quick --out bench_data/quick

clean:
	rm -rf shards data bench_data .pytest_cache
