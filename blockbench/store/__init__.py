"""The results store: the only code that reads and writes a results folder.

``layout``: the names and folders of a results root, a matrix and a cell, and the atomic writes;
``record``: the typed records on disk (``result.json``, ``load.json``, ``tune.json``,
``matrix_run.json``); ``tbruns``: where each cell's TensorBoard run lies; ``lineage``: which results
of other code count as this code's; ``reuse``: which earlier result counts for a cell, and the copy of
one trained in another matrix; ``checkpoints``: which checkpoint a cell would resume from, read
only; ``files``: the writes of the matrix's own files and the report's. The rest of ``blockbench``
takes folders and records from here and hands records back to be written; each module is imported
by name (``from blockbench.store.record import CellRecord``), so reading a layout name loads no
pydantic.
"""
