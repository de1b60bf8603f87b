"""Speculative decoding: proposers (drafters), tree building, lossless verification, metrics."""
