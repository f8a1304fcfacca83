"""Benchmarks, on demand: ``python -m bench NAME [--quick]``.

Each scenario measures its figures and baselines in the same run on the same machine, prints a
table, and ends with one line of JSON so runs can be compared across machines.
"""
