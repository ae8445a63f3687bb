"""Speculative decoders (draft model, MTP head, n-gram, select) and their CLI flags."""
