"""Qwen3-Next: gated delta-net and gated attention layers, MoE with a shared expert."""
