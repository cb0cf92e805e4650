PYTHON ?= python

.PHONY: space-image bench-docker

# The docker Space image (debootstrap base + Dockerfile); rebuilt only when its inputs change.
space-image:
	DO_NOT_TRACK=1 CUA_TELEMETRY=0 $(PYTHON) -m durable_spaces.backends.docker_image

bench-docker:
	DO_NOT_TRACK=1 CUA_TELEMETRY=0 $(PYTHON) -m bench.docker
