"""blockbench: run a matrix of Transformer variants x tasks x seeds with Lightning and report it."""

__version__ = "0.1.0"
