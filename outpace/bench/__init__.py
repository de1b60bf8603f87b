"""Benchmarks: results are data (JSON/CSV under benchmarks/results/), never test assertions."""
