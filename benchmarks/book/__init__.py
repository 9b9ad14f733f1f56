"""The book: rerun every matrix, compare two results folders, read how verdicts changed, and the
fingerprint lineage's retrained samples."""
