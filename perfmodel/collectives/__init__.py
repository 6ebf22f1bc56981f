"""Collective cost model: fabric links, phases, plain and compressed algorithms."""
