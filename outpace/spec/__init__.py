"""Speculative decoding: proposers, draft trees and lossless verification."""
