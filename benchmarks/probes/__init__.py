"""Investigations whose questions recur, each built on the harness (:mod:`benchmarks.workloads`,
:mod:`benchmarks.loaders`, :mod:`benchmarks.run_one`'s measuring) and on
:mod:`benchmarks.side_by_side`'s rounds, pairing and medians. Run each from the repository root
as ``python -m benchmarks.probes.NAME``; ``--help`` says what it measures, ``--toy`` runs it at
toy size. No probe imports another. docs/benchmarks.md lists them, and the retired ones.

- ``autotune``: ``io_concurrency="auto"`` against fixed settings (sweep, whole epochs, a shift).
- ``hf_datasets``: a Hugging Face ``datasets.Dataset`` through DataLoader and AsyncLoader.
- ``inmemory``: a 1 GiB array and 1M dicts held by the dataset, forked workers, against
  DataLoader: first batch of epochs 1 and 2, peak PSS of the process tree.
- ``jpeg_shards``: JPEG tar shards over HTTP, webdataset + DataLoader against asyncloader.
"""
