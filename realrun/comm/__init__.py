"""Compressed collectives on torch.distributed (see ``collectives``); torch loads on first use."""
from realrun.comm.names import RUNTIME_ALGORITHMS

_EXPORTS = ("Comm", "CommStats", "allgather", "allreduce", "alltoall", "broadcast", "default_comm", "recv",
            "reduce_scatter", "send", "shift")
__all__ = ["RUNTIME_ALGORITHMS", *_EXPORTS]


def __getattr__(name):
    if name in _EXPORTS:
        from realrun.comm import collectives

        return getattr(collectives, name)
    raise AttributeError(name)
