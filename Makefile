# Two entry points for a fresh machine (see README): `make demo` and `make test`.
# Both set up what they need, idempotently: a virtual environment in .venv with the project
# installed editable, and (where this is Debian and we are root) the Graphviz `dot` program.

PY     ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
OUT    := out
# torch is pinned to the release the suite is tested with (override with TORCH=...); any
# torch >= 2.3 works, see pyproject.toml.
TORCH  ?= torch==2.13.0

.PHONY: demo test lint fmt docs system-deps bytecode clean

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The package's bytecode, written ahead (only what changed since is compiled again): where
# PYTHONDONTWRITEBYTECODE is set, every process the tool starts (the planner's helpers,
# training workers, the tests' subprocesses) would otherwise compile each module it imports.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q spindle_dsl

# Graphviz's dot renders SVG/PNG; without it the project still writes DOT source (see README).
# Chromium (headless) lets a test open the HTML report as a browser would.
system-deps:
	@command -v dot >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null) \
	      || echo "warning: could not install graphviz; tests that need dot will be skipped"; \
	  else echo "warning: no dot program and no apt-get as root; tests that need dot will be skipped"; fi; }
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "warning: could not install chromium; the report's browser test will be skipped"; \
	  else echo "warning: no chromium and no apt-get as root; the report's browser test will be skipped"; fi; }

# The main job on the bundled tiny example: check it, plan it (JSON, wave picture, Perfetto
# trace, HTML report), then train it for real for 5 steps on 4 local worker processes.
demo: $(STAMP) bytecode system-deps
	mkdir -p $(OUT)
	$(BIN)/spindle check examples/tiny_mm.spindle
	$(BIN)/spindle profile examples/tiny_mm.spindle --devices 4 --nproc 4 --out $(OUT)/profile.json
	$(BIN)/spindle plan examples/tiny_mm.spindle --profile $(OUT)/profile.json \
	  --out $(OUT)/plan.json --svg $(OUT)/waves.svg --trace $(OUT)/plan-trace.json
	$(BIN)/spindle report examples/tiny_mm.spindle --profile $(OUT)/profile.json \
	  -o $(OUT)/report.html
	$(BIN)/spindle train examples/tiny_mm.spindle --plan $(OUT)/plan.json \
	  --profile $(OUT)/profile.json --nproc 4 --steps 10 \
	  --log-json $(OUT)/train-log.jsonl --trace $(OUT)/train-trace.json
	@echo "outputs in $(OUT)/: profile.json plan.json waves.svg plan-trace.json report.html" \
	  "train-log.jsonl train-trace.json"

test: $(STAMP) bytecode system-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q

lint:
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

# docs/cli.md is generated from the argument parsers, and tests/core/test_docs.py fails when it
# is out of date: run this after changing a command's options.
docs:
	$(BIN)/python -m spindle_dsl.cli.docs --out docs/cli.md

clean:
	rm -rf $(VENV) $(OUT) build *.egg-info .pytest_cache .hypothesis
