"""Benchmarks: ``python -m bench.<topic>`` from the repo root."""
