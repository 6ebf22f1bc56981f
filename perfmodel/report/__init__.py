"""The report stage: text tables (``text``), pictures (``plots``, ``timeline``) and Chrome traces
(``trace``) of step predictions.
"""
