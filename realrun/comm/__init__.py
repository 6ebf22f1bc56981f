"""Compressed collectives on torch.distributed (see ``collectives``)."""
from realrun.comm.collectives import (ALGORITHMS, allgather, allreduce, broadcast, recv, reduce_scatter, send)

__all__ = ["ALGORITHMS", "allgather", "allreduce", "broadcast", "recv", "reduce_scatter", "send"]
