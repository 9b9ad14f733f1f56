"""A matrix's TensorBoard runs: their names, their views, their event files, the log folders that hold
them, and the runs rebuilt from cell records, on the ground floor so that the runner
(``blockbench.matrix``), the cell (``blockbench.cell``) and the command line share one definition of
what a run holds and a live run and a rebuilt one read the same.

The modules, each of one concept, bottom up:

* :mod:`~blockbench.tensorboard.names`: the tags of a run (tag groups ``0_main`` ... ``z_final``, the
  final figures), a cell's HParams row and TensorBoard's order of tags; standard library only, so
  that ``blockbench.store.record`` names the final figures without importing TensorBoard.
* :mod:`~blockbench.tensorboard.views`: the views of a log folder (the HParams experiment, the Custom
  Scalars layout) and a cell's HParams session, as TensorBoard's protocol buffers.
* :mod:`~blockbench.tensorboard.events`: a run's event files on disk: written whole, read back for
  their views, rewritten with new ones.
* :mod:`~blockbench.tensorboard.logdirs`: a matrix's log folders made ready before its first cell
  (runs of older layouts moved in, each folder's views published into its runs), and the
  ``tensorboard --logdir`` line a reader is told.
* :mod:`~blockbench.tensorboard.rebuild`: ``blockbench report --tensorboard``, the runs rebuilt from
  a results folder's cell records.
* :mod:`~blockbench.tensorboard.writer`: the live writer inside a training cell (Lightning's logger
  with the renamed tags, the views and the HParams row it writes at the start and the end).

This ``__init__`` imports nothing, so that importing :mod:`~blockbench.tensorboard.names` loads neither
TensorBoard nor torch.
"""
