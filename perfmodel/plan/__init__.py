"""The plan stage: the parallel layout of a step (``parallel``), its mesh of ranks and groups (``mesh``),
memory per GPU (``memory``) and importers of other stacks' configs (``deepspeed``).
"""
