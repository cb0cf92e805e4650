"""The checkpoint engine: snapshots.py (the entry point: the providers), store, manifests."""
