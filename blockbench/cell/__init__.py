"""One cell in its own process: the Lightning trainer (``train``), its callbacks (speed, validation
history, loss curve, divergence guard, checkpoints), the FLOP and peak FLOP/s accounting (``perf``)
and the cell's TensorBoard run. It writes the cell's record (``blockbench.store.record``) and imports
neither the runner (``blockbench.matrix``) nor the report (``blockbench.report``). Its code is part of
the results' code fingerprint (``blockbench.provenance``).
"""
