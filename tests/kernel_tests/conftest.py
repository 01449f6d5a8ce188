"""Kernel tests run the Triton kernels on the CPU through the interpreter."""

import os

# Read when `@triton.jit` runs, so set before any rendered kernel module is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
