# The README's two commands: `make demo` and `make test` (both run setup first).
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test test-unit test-kernel bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m pipexctl.demo

# The full suite: unit tests on the host, kernel tests in ONE boot of the
# Debian-kernel guest (see tests/conftest.py).  Fails if the guest cannot run.
test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest -m "not kernel" $(PYTEST_ARGS)

test-kernel: setup
	$(PY) -m pytest -m kernel $(PYTEST_ARGS)

# Data-plane benchmark in one guest boot (not a test; asserts nothing).
bench: setup
	@$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/run.py

clean:
	rm -rf .venv build .pytest_cache
