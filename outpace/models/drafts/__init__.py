"""Draft networks (EAGLE3, DFlash, MTP heads, Gemma 4 assistants): the modules the drafters in speculative/drafters/ run."""
