"""Facts about this host the adapter and backends read: mounts, processes, cgroups."""
