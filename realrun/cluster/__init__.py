"""An emulated multi-host cluster on one Linux machine: network namespaces with rate-limited links.

    spec = EmulatedSpec(hosts=4, bandwidth="1gbit")
    up(spec, name="emu")                  # as root; names start with "cmp-emu-"
    run("emu", ["python", "-m", "realrun.cli", "bench", "allreduce", ...])
    down("emu")                           # idempotent; removes everything, also after a crash
"""
from realrun.cluster.emulated import EmulatedSpec, down, shape, status, up
from realrun.cluster.launch import run

__all__ = ["EmulatedSpec", "down", "run", "shape", "status", "up"]
