"""The GPU check (``check``), run as ``python benchmarks/gpu_check.py``."""
