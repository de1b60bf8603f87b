"""Quantized weights kept quantized in memory: the formats' math (dequantize.py), the config scheme
(scheme.py), the linear layers (linear.py) and the GPU kernels (the *_kernel*.py files)."""
