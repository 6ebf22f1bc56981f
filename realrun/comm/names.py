"""Names shared without importing torch."""
ALGORITHMS = ("ring", "recursive_doubling", "allgather", "two_phase", "hierarchical")
OP_TIMEOUT_S = 60.0   # a collective or transfer that waits longer on a peer ends the run (a stalled or stopped rank)
