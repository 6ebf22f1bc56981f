"""The step stage: compute time of a microbatch (``compute``), pipeline schedules (``schedule``,
``makespan``) and the analytical step time from costed events (``timing``).
"""
