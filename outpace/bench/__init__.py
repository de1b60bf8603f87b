"""Benchmarks: results are data (JSON/CSV under benchmarks/), never test assertions."""
