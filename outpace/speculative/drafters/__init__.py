"""Drafters: one file each, every one a ``Proposer`` (speculative/proposer.py) registered in registry.py."""
