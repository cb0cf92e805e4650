PYTHON ?= python

.PHONY: space-image bench-docker microvm-image bench-microvm

# The docker Space image (debootstrap base + Dockerfile); rebuilt only when its inputs change.
space-image:
	DO_NOT_TRACK=1 CUA_TELEMETRY=0 $(PYTHON) -m durable_spaces.backends.docker_image

bench-docker:
	DO_NOT_TRACK=1 CUA_TELEMETRY=0 $(PYTHON) -m bench.docker

# The microvm guest (kernel, initramfs, qcow2 rootfs) and its booted base checkpoint;
# rebuilt only when its inputs change (images/microvm/ci-setup.sh installs QEMU first).
microvm-image:
	DO_NOT_TRACK=1 CUA_TELEMETRY=0 $(PYTHON) -m durable_spaces.backends.microvm_image

bench-microvm:
	DO_NOT_TRACK=1 CUA_TELEMETRY=0 $(PYTHON) -m bench.microvm
