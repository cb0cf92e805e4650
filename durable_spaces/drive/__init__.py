"""Driving a session: the driver entry, warm drivers, the coordinator."""
