"""Calibration and validation: measurement records (``measurements``), fitted profiles (``profile``,
``fit``) and the model against published measurements (``published``).
"""
