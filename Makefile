# Two commands a newcomer runs: `make demo` (the main job) and `make test`.
# Each creates its own virtualenv; DEPS picks the dependency set (newest | debian12).
PYTHON ?= python3
DEPS ?= newest
VENV ?= .venv
STAMP := $(VENV)/.deps-$(DEPS)

.PHONY: demo test lint bench deb clean

# The editable install builds with the venv's own setuptools (--no-build-isolation: no
# build environment to fetch). A venv of Python 3.12 or later (Debian 13's 3.13) has
# pip only, no setuptools; 3.11's (Debian 12) has one new enough (pyproject.toml's floor,
# so nothing is fetched there); setuptools needs `wheel` for the build, which a venv
# may lack. One way, no fallback: a fallback would print the first attempt's error.
$(STAMP): requirements/$(DEPS).txt
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements/$(DEPS).txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check 'setuptools>=61' wheel
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/caldera demo

# pytest exits 5 when it collected no test: that is a failure here, said plainly.
test: $(STAMP)
	@$(VENV)/bin/python -m pytest -q -ra tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no test" >&2; fi; exit $$rc

# ruff and mypy (setup.cfg, pyproject.toml) from the developer set, in a venv of their own:
# any finding fails. The runtime's dependencies are unchanged.
LINT_VENV ?= .venv-lint
$(LINT_VENV)/.deps-dev: requirements/dev.txt requirements/newest.txt
	rm -rf $(LINT_VENV)
	$(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements/dev.txt
	touch $@

lint: $(LINT_VENV)/.deps-dev
	$(LINT_VENV)/bin/ruff check .
	$(LINT_VENV)/bin/mypy

bench: $(STAMP)
	$(VENV)/bin/python bench/run_all.py

deb:
	packaging/build-deb.sh

clean:
	rm -rf $(VENV) $(LINT_VENV) build dist *.egg-info
