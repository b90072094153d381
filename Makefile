# Two commands are the quick start: `make demo` and `make test`. Each builds the project-local virtual
# environment (.venv) on first use and reinstalls when the packaging files change.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: chromium demo test test-calibration lint typecheck bench experiment services-start services-stop clean

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,experiment,deploy]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/scrapy demo

test: $(STAMP) chromium
	$(BIN)/python -m pytest

# The simulator against a real run: sensitive to the machine's load, so apart from `make test` (docs/development.md).
test-calibration: $(STAMP)
	$(BIN)/python -m pytest -m calibration

# The dashboard's browser tests drive the system's Chromium (Debian's `chromium`), never `playwright install`.
# As root with apt it is installed here; elsewhere the browser tests are skipped with a message saying how to
# install it, except under CI=true, where a missing Chromium fails them.
chromium:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y chromium || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; } \
	      || echo "!!! apt-get could not install chromium: the dashboard's browser tests cannot run"; \
	  else \
	    echo "!!! chromium not found and not installable here (needs root and apt): the dashboard's browser" \
	         "tests will be skipped (failed under CI=true). Install it: sudo DEBIAN_FRONTEND=noninteractive apt-get install -y chromium"; \
	  fi; }

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
