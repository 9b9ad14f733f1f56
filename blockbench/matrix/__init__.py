"""Many cells: a matrix file expanded into cells (``expand``), their status and time estimates
(``plan``), the tuning rules of ``tune:`` (``tuning``), the processes that train them (``jobs``: a
cell's folder, command, slot and cluster job; ``launch``: the preloaded fork server and stopping the
cells), the runner's printed lines (``say``) and the run from plan to summary (``run``). It starts
cells (``blockbench.cell``) and writes the summary (``blockbench.report``); neither imports it.
"""
