"""Runnable examples (``make demo``); ``latency_server`` is also the benchmarks' HTTP server."""
