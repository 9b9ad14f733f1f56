"""Many cells: a matrix file expanded into cells (``expand``), their status before the run (``plan``),
the tuning rules of ``tune:`` (``tuning``), which cells the results call for next (``schedule``: the
tuning rungs, the rounds of seeds), the rounds trained (``rounds``), the processes that train them
(``jobs``: a cell's folder, command, slot and cluster job; ``launch``: the preloaded fork server and
stopping the cells), the time estimate (``estimate``), the runner's printed lines (``say``) and the run
from plan to record (``run``, ``finish``). It starts cells (``blockbench.cell``) and reads and writes
results through the store (``blockbench.store``); the report is handed in by the command line.
"""
