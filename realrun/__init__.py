"""realrun: the runtime. Compressors on real arrays (numpy on CPU) built from the same spec
strings perfmodel parses; compressed collectives, hooks and benchmarks come on top of them."""
__version__ = "0.1.0"
