# The docker Space: a Debian bookworm minbase (imported by `make space-image`, see
# durable_spaces/backends/docker/image.py) plus the static cua-spacesd from the cua wheel.
# pid 1 is `cua-spacesd supervise`: it serves the daemon and reaps orphans (plain `serve`
# as pid 1 left backgrounded commands' orphans as zombies). The token comes from a file
# bind-mounted read-only at /run/cua/env-token, never from the environment.
ARG BASE
FROM ${BASE}
COPY cua-spacesd /usr/local/bin/cua-spacesd
# `supervise` takes the daemon's settings from the environment only (no serve flags).
ENV HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CUA_ENV_LISTEN=0.0.0.0:3211 CUA_ENV_DATA_DIR=/var/lib/cua-spacesd \
    CUA_ENV_TOKEN_FILE=/run/cua/env-token CUA_ENV_NO_DESKTOP=true CUA_ENV_NO_DRIVER=true \
    CUA_ENV_NO_MCP=true CUA_ENV_QUIC_PORT=0 DO_NOT_TRACK=1 CUA_TELEMETRY=0
# pid 1 and the daemon run in /, never in the workspace (the adapter reads
# processes whose cwd is inside it as leftovers of commands).
WORKDIR /
EXPOSE 3211
ENTRYPOINT ["/usr/local/bin/cua-spacesd", "supervise", "--on-exit", "serve", "--"]
CMD []
