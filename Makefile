# Two commands on a fresh clone: `make bench` (the main job) and `make test` (the CPU test suite).
# Both create or reuse .venv at the repository root (see scripts/setup_venv.sh).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.cs336-installed

.PHONY: bench test lint report clean-venv

$(STAMP): pyproject.toml scripts/setup_venv.sh
	bash scripts/setup_venv.sh $(VENV)
	touch $(STAMP)

# On a CUDA machine: the handout's end-to-end benchmark (presets x modes); on a CPU-only
# machine: the embedded tiny default (a few steps, well under two minutes).
bench: $(STAMP)
	$(PY) -m cs336_systems bench --default

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

report: $(STAMP)
	$(PY) -m cs336_systems report

clean-venv:
	rm -rf $(VENV)
