"""The built-in quant types: float storage, Q8_0, Q4_0, K-quants and FP8 E4M3."""
