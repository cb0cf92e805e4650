"""Backend ``docker``: real containers of this repo's ``Dockerfile`` running cua-spacesd.
``backend`` (containers), ``docker_space`` (the container's Space and probe), ``image`` (the
offline image build, on ``guest_rootfs``)."""

from durable_spaces.backends.docker.backend import DockerBackend, unavailable_reason

__all__ = ["DockerBackend", "unavailable_reason"]
