"""The cluster lab: test hosts in network namespaces, workers, the queue."""
