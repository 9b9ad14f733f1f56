"""Statistics: the verdict rule simulated on the book's noise (``verdict_error_rates``), the shared
baseline's seed allocation, the time estimates against the measured time, and the mutation check of the
tests that guard the verdicts."""
