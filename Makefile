# Two commands are the quick start: `make demo` and `make test`. Each builds the project-local virtual
# environment (.venv) on first use and reinstalls when the packaging files change.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck bench experiment services-start services-stop clean

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,experiment]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/scrapy demo

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check scheduler_ext product_crawl tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_node.py
	$(BIN)/python benchmarks/bench_scheduler.py
	$(BIN)/python benchmarks/bench_control.py

experiment: $(STAMP)
	$(BIN)/scrapy experiment --profile paper --strategies dynamic,shared,oracle

services-start: $(STAMP)
	$(BIN)/scrapy services start

services-stop: $(STAMP)
	$(BIN)/scrapy services stop

clean:
	rm -rf $(VENV) var build *.egg-info
