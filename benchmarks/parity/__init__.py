"""Parity: the implementations people use, built at our sizes (``implementations``), and whether any
family's initialisation handicaps it against them (``init_parity``)."""
