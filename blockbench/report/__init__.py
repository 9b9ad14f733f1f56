"""What the runs left, read back: the records of a matrix's cells (``results``), the statistics of
each task (``analysis``, ``stats``), the verdicts, the rendered summary and plots, and the index of
every matrix (``results/README.md``). It imports neither the trainer nor the runner: a results
folder is summarized without Lightning.
"""
