"""Gemma 4 (E-series: KV-shared layers, per-layer embeddings, prefill pruning)."""
