"""Durable sessions beyond one machine: hosts, coordinators and workers on PostgreSQL.

The shared state: ``ClusterStore`` (``store.py``) keeps hosts, durable Spaces, leases,
sessions, an append-only event log and the campaign run queue in PostgreSQL, with exact
lease-token and epoch semantics; ``PgServer`` (``pgserver.py``) runs a private PostgreSQL
for tests, CI and a one-machine lab.

The processes, any of which may die:

- ``host.py`` (``durable-spaces host``): provides durable Spaces from one machine
  (``hostapi.py`` is its HTTP API, place, rotate, status, and its client;
  ``hostroutes.py`` its routes, which ``hostserver.py`` serves over mutual TLS within
  bounds); reports sandboxes that are gone; drops everything and registers again once
  declared lost.
- ``pki.py``, ``tls.py``, ``certificates.py``, ``enrol.py`` (``durable-spaces tls``): the
  cluster CA (its key with the operator), each machine's certificate and TLS directory,
  rotation and revocation (docs/cluster-security.md).
- ``drive.py`` (``durable-spaces coordinator``): claims sessions and drives each with the
  single-host coordinator (``drive/coordinator.py``), epochs from the store, the Space
  made ready by ``placer.py`` before every drive.
- ``remote.py`` (backend ``remote``): how a driver finds its Space through the store with
  its lease token; ``address.py``: what a placement's address says.
- ``forward.py``: a docker host's port forward to a container.
- ``commands.py``: what ``durable-spaces host`` and ``coordinator`` do.

The lab's side of the cluster is ``campaigns/cluster/``: ``submit.py`` (``durable-spaces
submit``) adds sessions, ``workers.py`` (``durable-spaces worker``) runs campaign runs
from the queue, ``netns.py`` and ``lab.py`` make test hosts in network namespaces and a
whole cluster on one machine (tests, ``bench/cluster.py``).

On real machines (one PostgreSQL every machine reaches; ``DS_CLUSTER_DB`` holds its URL
so no password shows in ``ps``): on each machine that provides Spaces, ``durable-spaces
host --id h1 --address <its ip>:7000 --backend spacesd --tls-dir DIR`` (its Spaces'
daemons listen on that ip; the host API speaks mutual TLS only, with certificates of the
cluster's CA enrolled by ``durable-spaces tls enroll``, and each Space's daemon token is
rotated for every lease, the old one refused: docs/cluster-security.md); anywhere, as
many ``durable-spaces coordinator --id cN --sessions-dir /shared/sessions --tls-dir DIR``
as you like (the
directory must be the same shared mount, with working ``fcntl`` locks, on every
coordinator's machine: it holds the sessions' fenced SQLite logs); ``durable-spaces submit
--sessions-dir /shared/sessions --name s1 --space sp1`` to add a session; ``durable-spaces
worker --id wN --work-dir /var/tmp/ds-runs`` on each machine that runs campaign runs.
``--backend docker`` hosts forward a port of their address to each container (docker
publishes Spaces on loopback only); ``local`` hosts only serve drivers on their own
machine (their Spaces are directories).

Import from the modules (``psycopg`` is needed only by the store).
"""
