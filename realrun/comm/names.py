"""Names shared without importing torch."""
ALGORITHMS = ("ring", "recursive_doubling", "allgather", "two_phase", "hierarchical")
