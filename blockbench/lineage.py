"""Re-exports the results store's lineage (``blockbench.store.lineage``) for benchmarks/, until it imports the store."""

from .store.lineage import Lineage as Lineage
from .store.lineage import Selector as Selector
from .store.lineage import Step as Step
