"""Names shared without importing torch."""
from perfmodel.collectives.registry import RUNTIME_ALGORITHMS  # noqa: F401  (named by users)
OP_TIMEOUT_S = 60.0   # a collective or transfer that waits longer on a peer ends the run (a stalled or stopped rank)
