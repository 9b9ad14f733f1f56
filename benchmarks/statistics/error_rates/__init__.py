"""The verdict error rates' simulation (``benchmarks.statistics.verdict_error_rates`` runs it), by
concept: the book's noise, the rule simulated, skewed differences, the empirical null pool, the report."""
