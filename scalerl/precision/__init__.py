"""Precision modes: FP8 matmuls, low-bit optimizer states, an 8-bit frozen reference."""
