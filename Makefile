# durable-spaces: every target does its own set-up, so each works on a fresh machine.
PYTHON ?= python
PIP ?= $(PYTHON) -m pip
export DO_NOT_TRACK := 1
export CUA_TELEMETRY := 0

# Campaign knobs (the CRASH_* variables the CLI reads; override on the command line).
CRASH_MODE ?= transactional
CRASH_BACKEND ?= local
CRASH_RUNS ?= 40
CRASH_CALLS ?= 8
CRASH_SEED_BASE ?= ds
export CRASH_MODE CRASH_BACKEND CRASH_RUNS CRASH_CALLS CRASH_SEED_BASE

.PHONY: setup system-deps test campaign ci bench lint space-image microvm-image \
        bench-log bench-spaces bench-adapter bench-docker bench-microvm bench-campaign \
        bench-mechanisms

# Python packages (PyPI only: the test tools and the harnesses the probe's built-in recipes
# run), the project itself in editable mode, its bytecode compiled once: with PYTHONDONTWRITEBYTECODE set (as on these machines) every driver a campaign
# starts would compile every module again (~30 ms of CPU each; bench/resume.py).
setup:
	$(PIP) install -q -e '.[test,lab,probe]'
	$(PYTHON) -m compileall -q durable_spaces

# Debian packages, a running dockerd, the docker Space image, the microvm guest, FUSE
# for the power-loss filesystem, PostgreSQL for the cluster state, ip/iptables for its hosts,
# Chromium for the report test, Node and the Pi coding agent (npm, a project-local prefix).
system-deps:
	bash images/space/ci-setup.sh
	bash images/microvm/ci-setup.sh
	sh images/powerfs/ci-setup.sh
	sh images/postgres/ci-setup.sh
	sh images/netns/ci-setup.sh
	sh images/chromium/ci-setup.sh
	sh images/probe/ci-setup.sh

# The README's test command: the whole suite, in parallel.
test: setup system-deps
	$(PYTHON) -m pytest -n auto -q

# The main job: a real campaign on the default (embedded `local`) backend, with a report.
campaign: setup
	durable-spaces campaign

# The CI fast subset: every campaign mode on local and spacesd, fixed seeds.
ci: setup
	bash .ci/campaigns.sh

lint: setup
	ruff check durable_spaces tests bench
	mypy

# The docker Space image (debootstrap base + Dockerfile); rebuilt only when its inputs change.
space-image:
	$(PYTHON) -m durable_spaces.backends.docker.image

# The microvm guest (kernel, initramfs, qcow2 rootfs) and its booted base checkpoint;
# rebuilt only when its inputs change (images/microvm/ci-setup.sh installs QEMU first).
microvm-image:
	$(PYTHON) -m durable_spaces.backends.microvm.image

bench: setup bench-log bench-spaces bench-adapter bench-campaign bench-docker bench-microvm bench-mechanisms

bench-log:
	$(PYTHON) -m bench.log
bench-spaces:
	$(PYTHON) -m bench.spaces --backends local,spacesd,docker
bench-adapter:
	$(PYTHON) -m bench.adapter
bench-campaign:
	$(PYTHON) -m bench.campaign
bench-docker:
	$(PYTHON) -m bench.docker
bench-microvm:
	$(PYTHON) -m bench.microvm
bench-mechanisms:
	$(PYTHON) -m bench.mechanisms
