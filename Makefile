# The README's two commands: `make demo` and `make test` (both run setup first).
PY := .venv/bin/python
PYTEST_ARGS ?=
# The guests: `make test` runs the kernel tests in both, Debian 12 (kernel 6.1, pppd 2.4.9) and
# Debian 13 (kernel 6.12, pppd 2.5.2), except those pinned to Debian 12 and those of userspace
# behaviour only (marker one_debian: the first Debian); docs/testing.md "Two Debians";
# `make test DEBIAN=12` (or 13) runs one.  demo and bench boot one guest: 12 unless DEBIAN=13.
DEBIAN ?=
TEST_DEBIAN = $(if $(DEBIAN),PIPEXCTL_DEBIAN=$(DEBIAN) )
ONE_DEBIAN = $(or $(DEBIAN),12)

.PHONY: setup demo test test-long test-unit test-kernel deb bench bench-profile churn scale clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m pipexctl.demo --debian $(ONE_DEBIAN)

# The full suite: unit tests on the host, kernel tests in one boot per guest
# (see tests/conftest.py).  Fails if a guest cannot run.  The Debian package is
# built first: a guest test installs and purges it.  Tests marked `long` (long
# runs of behaviour the suite covers in part) are left to `make test-long`.
test: setup deb
	$(TEST_DEBIAN)$(PY) -m pytest -m "not long" $(PYTEST_ARGS)

# The long runs, in the Debian 12 guest (docs/testing.md).
test-long: setup deb
	$(TEST_DEBIAN)$(PY) -m pytest -m long $(PYTEST_ARGS)

# dist/pipexctl_<version>_amd64.deb (scripts/build_deb.sh)
deb: setup
	@bash scripts/build_deb.sh

test-unit: setup
	$(PY) -m pytest -m "not kernel" $(PYTEST_ARGS)

test-kernel: setup deb
	$(TEST_DEBIAN)$(PY) -m pytest -m "kernel and not long" $(PYTEST_ARGS)

# Data-plane benchmark in one guest boot (not a test; asserts nothing).
bench: setup
	@$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/run.py --debian $(ONE_DEBIAN)

# A kernel profile (perf, cpu-clock) of one iperf3 run of cases (c) and (d):
# where the CPU per Mbit/s goes.  Needs linux-perf; writes bench/results/profile/.
bench-profile: setup
	$(PY) -m pipexctl.testing.vm --timeout 1800 --keep-results bench/results/profile -- $(PY) bench/profile_dp.py

# 1,000 connect/disconnect cycles of offloaded calls in one guest boot, then
# the leak count (not part of `make test`, which runs 18 cycles, LNS hang-ups
# included).  Long runs leave the LNS hang-up out: a redial after it can hit
# xl2tpd 1.3.18's own control-sequence bug (docs/testing.md).
CHURN_ARGS ?= --cycles 1000 --kinds lac-disconnect,pppd-kill
churn: setup
	$(PY) -m pipexctl.testing.vm --timeout 5400 --keep-results bench/results/churn -- $(PY) -m pipexctl.testing.churn $(CHURN_ARGS)

# SCALE_LACS x SCALE_XL2TPD real calls through one daemon in one guest boot
# (bench/scalecalls.py): all offloaded with the daemon's fds past 1,024, then
# all hung up with nothing left; the record goes to bench/results/scale/.
SCALE_LACS ?= 12
SCALE_XL2TPD ?= 50
scale: setup
	$(PY) -m pipexctl.testing.vm --flavour debian$(ONE_DEBIAN) --memory 8192 --timeout 5400 --keep-results bench/results/scale \
		-- $(PY) bench/scalecalls.py --lacs $(SCALE_LACS) --sections $(SCALE_XL2TPD)

clean:
	rm -rf .venv build dist .pytest_cache
