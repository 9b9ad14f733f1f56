"""The time a matrix run will take: one observer of the run, fed by the plan and by the cells as they end.

Where the time estimate of a cell comes from, best first (:class:`~.estimator.TimeEstimator`):

1. ``measured``: cells of the same task and variant that ran on this machine: in this run (their whole
   process, start to exit, as the runner saw it), else earlier results in the matrix folder (their
   record's ``wall_time_breakdown`` total: the cell's process, start-up to the result);
2. ``scaled``: a variant none of whose cells finished, timed in parts before the cells (3.), times the
   measured-to-timed ratio of the cells that finished (its task's, else all): what the timing
   missed, such as a machine busier than when it was timed;
3. ``timed``: a variant with no measured cell, its cell timed in parts (:mod:`~.timing`): a short fit
   in a process started as the cell's, beside as many as ``--jobs`` runs at once, scaled to the
   cell's steps, validations, loss-curve points and checkpoints, plus its process start, build and
   Lightning's set-up. The dry run times the variants with nothing measured; the run itself only with
   ``--time-cells`` (else its ETA starts from the sources below and the cells as they end);
4. ``running``: the pace that the training cells of a variant print in their train.log since this
   run began (training and validation, not start-up);
5. ``same shape``: the step time of the other variants of the cell's task whose model and batch have
   its sizes (a ladder's rung: the rungs of one task differ about fivefold in step time), a guess;
6. ``other variants``: the step time of the other variants of the cell's task, a rough guess;
7. ``other tasks``: the step time of the cells of other tasks, a rougher guess still;
8. unknown: no estimate (nothing measured here yet, or a cell whose data or model cannot be built).

On a GPU a small cell's time is mostly its process's start-up and its kernels' launches, alike for the
variants of one shape, so the timing there is not one process per variant, one after another: a
variant with nothing measured takes the measured pace of the cells of its task and shape (``same
shape``, after 1., not 5.), else the timing of one cell per task and shape (``task probe``, in place
of 3.; the timings of the shapes run ``--jobs`` at a time).

A matrix run's time is more than its cells': the process's start-up and planning, the cell server's
imports (and, with ``--time-cells``, the timing) before the first cell, the report after the last
(:func:`~.timing.report_seconds`). The cells run ``--jobs`` at a time, phase after phase (tuning rung
after rung, then the reported cells), as the runner's queue hands them out (:func:`~.timing.makespan`).
:mod:`~.total` adds them up (the total of the dry run, the run's progress line and its ETA) and
:mod:`~.dry_run` prints the plan of ``--dry-run``.
"""
