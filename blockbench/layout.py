"""Re-exports the results store's layout (``blockbench.store``) for the fingerprinted modules and the unswitched."""

# cell/: the fingerprinted modules, switched in a fingerprinted batch; benchmarks/: until it imports the store
from .store.layout import CELL_FILE as CELL_FILE  # benchmarks/
from .store.layout import CELLS_DIR as CELLS_DIR  # benchmarks/
from .store.layout import CHECKPOINT_DIR as CHECKPOINT_DIR  # cell/
from .store.layout import CONFIG_FILE as CONFIG_FILE  # cell/
from .store.layout import MAX_RUNS_PER_LOGDIR as MAX_RUNS_PER_LOGDIR  # benchmarks/
from .store.layout import RESULT_FILE as RESULT_FILE  # cell/
from .store.layout import TB_DIR as TB_DIR  # benchmarks/
from .store.layout import TB_TUNE_DIR as TB_TUNE_DIR  # benchmarks/
from .store.layout import TB_VIEWS_FILE as TB_VIEWS_FILE  # cell/
from .store.layout import TUNE_DIR as TUNE_DIR  # benchmarks/
from .store.layout import write_atomic as write_atomic  # cell/
from .store.layout import write_json as write_json  # cell/
