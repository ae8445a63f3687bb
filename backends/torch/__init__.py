"""The torch backend: ops, packed weights, MoE kernels and the fused decode block."""
