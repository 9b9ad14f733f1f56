"""Task data: embedded generators (deterministic from a seed, no download) and real-data loaders."""


class DataError(ValueError):
    """Input data that cannot be used; the message names the file (and line where it applies)."""
