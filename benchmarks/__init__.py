"""Benchmarks: asyncloader beside DataLoader, torchdata.nodes and SPDL (`make bench`)."""
