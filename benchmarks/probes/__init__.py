"""One-off investigations behind the numbers in ``docs/``, each built on the harness
(:mod:`benchmarks.workloads`, :mod:`benchmarks.loaders`, :mod:`benchmarks.run_one`'s measuring,
:func:`benchmarks.side_by_side.in_fresh_process` and the http workload's server). ``make
bench`` runs none of them. Run each from the repository root as ``python -m
benchmarks.probes.NAME``; ``--help`` says what it measures.

- ``exit_time``: exit after a raise with a live iterator, and workers' exit after a SIGKILL.
- ``gpu_copy``: host-to-GPU copy, pageable against pinned against asyncloader's device thread.
- ``http_scaling``: ``HTTPSource``'s items/s against ``io_concurrency`` behind the 20 ms server.
- ``inmemory``: a 1 GiB array and 1M dicts held by the dataset, forked workers, against
  DataLoader: first batch of epochs 1 and 2, peak PSS of the process tree.
- ``io_ceiling``: a bare uvloop program on the io workload, the ceiling asyncloader is held to.
- ``process_split``: one epoch's CPU and page faults, main process against each worker.
- ``repeatable_draws``: random augmentations run after run, across worker counts and resume.
- ``option_cost``: the cost of one option (``seed_per_sample`` on cpu, ``distributed`` on overhead).
- ``sleep_precision``: how long ``asyncio.sleep(0.020)`` really takes.
- ``sync_vs_async``: ``for`` (the sync wrapper) against ``async for`` on io.
"""
