"""The native C kernels: build, probe, self-test and ctypes wrappers."""
