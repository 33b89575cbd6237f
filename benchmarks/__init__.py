"""Benchmarks: asyncloader beside DataLoader, torchdata.nodes and SPDL.

This package is the harness that ``make bench`` runs; :mod:`benchmarks.probes` holds one-off
investigations built on it. ``docs/benchmarks.md`` says which module does what.
"""
