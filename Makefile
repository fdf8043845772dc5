# Each target creates .venv and installs what it needs on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-multihost demo-ha test test-unit test-suites test-python docs docs-check bench protos clean

# mkdocs 1.6 prints a banner about its successor on every build; it says nothing about this manual.
export NO_MKDOCS_2_WARNING := 1

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[tf,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tfcluster demo

# The demo across three network-namespace hosts with their own IPs (needs root and iproute2).
demo-multihost: $(STAMP)
	$(PY) -m tfcluster.demo.multihost

# A failover: a 3-member etcd on loopback, two coordinators, two agents, kill -9 of the leader mid-job (needs etcd).
demo-ha: $(STAMP)
	$(PY) -m tfcluster.demo.ha

# The suite in TEST_JOBS processes, each taking whole test files (a file's tests share its clusters), then the
# tests marked `alone` one by one with nothing beside them. The slowest tests are named at the end of each part, so
# that a suite that grows slow shows where. TEST_JOBS=1: all of it in one process, in order.
TEST_JOBS ?= 3
SIDE_BY_SIDE = $(if $(filter-out 1,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadfile)
test: docs-check
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 $(SIDE_BY_SIDE) $(if $(SIDE_BY_SIDE),-m "not alone")
	$(if $(SIDE_BY_SIDE),$(PY) -m pytest -q -p no:cacheprovider --durations=5 -m alone)

test-unit: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

# The unit and integration suites alone (no TensorFlow jobs).
test-suites: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/unit tests/integration

# What differs from one Python to another, on another Python in a virtualenv of its own: the unit suite, and the
# integration tests that unpack code archives (tarfile), build jobs' environments (venv, uv), start both daemons
# from their command lines and drive the client API and the CLI's output.
#   make test-python PYTHON=/usr/bin/python3 VENV=.venv-system
PYTHON_SENSITIVE := tests/unit $(wildcard tests/integration/test_code_*.py) tests/integration/test_shipping.py \
	tests/integration/test_environments.py tests/integration/test_environment_attacks.py \
	tests/integration/test_daemons.py tests/integration/test_python_api.py tests/integration/test_task_reach.py \
	tests/integration/test_control_plane.py
test-python: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(SIDE_BY_SIDE) $(PYTHON_SENSITIVE)

# The manual (docs/, mkdocs.yml) as a site in build/site.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir build/site

# The manual builds without a warning (a broken link or anchor fails), into a dir thrown away after.
docs-check: $(STAMP)
	@site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && $(PY) -m mkdocs build --strict --site-dir "$$site"

# Ends with the regression guard: the bench fails when a ratio written in this run is past its target
# (bench/targets.py); the stamp tells the guard which JSON files this run wrote.
bench: $(STAMP)
	@mkdir -p build && touch build/bench-started
	$(PY) bench/run.py
	$(PY) bench/cli.py
	$(PY) bench/job_dirs.py
	$(PY) bench/handoff.py
	$(PY) bench/queue_burst.py
	$(PY) bench/usage_ledger.py
	$(PY) bench/memwatch.py
	$(PY) bench/scale.py
	$(PY) bench/multihost.py
	$(PY) bench/environments.py
	$(PY) bench/code_shipping.py
	$(PY) bench/etcdstore.py
	$(PY) bench/failover.py
	$(PY) bench/standby_down.py
	$(PY) bench/connections.py
	$(PY) bench/streams.py
	$(PY) bench/agent_restart.py
	$(PY) bench/agent_history.py
	$(PY) bench/heartbeat_profile.py
	$(PY) bench/storm.py
	$(PY) bench/guard.py --since build/bench-started

# Regenerate tfcluster/api/v1 from protos/ (commit the result; a test checks they match).
protos: $(STAMP)
	$(PY) scripts/genproto.py

clean:
	rm -rf $(VENV) .venv-*/ build *.egg-info
