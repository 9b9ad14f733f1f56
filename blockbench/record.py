"""Re-exports the results store's records (``blockbench.store``) for the fingerprinted modules and the unswitched."""

# cell/: the fingerprinted modules, switched in a fingerprinted batch; benchmarks/: until it imports the store
from .store.record import RECORD_VERSION as RECORD_VERSION  # cell/
from .store.record import CellRecord as CellRecord  # cell/
from .store.record import load_record as load_record  # benchmarks/
from .store.record import read_matrix_run as read_matrix_run  # benchmarks/
from .store.record import read_record as read_record  # benchmarks/
from .store.record import write_record as write_record  # cell/
