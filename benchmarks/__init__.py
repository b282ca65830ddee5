"""Side-by-side benchmarks of flight-serve against its baselines (DESIGN §10).

Every figure is measured in one process and run, alternating subject and baseline, and reported
as a ratio to the baseline. ``python -m benchmarks.run`` (``make bench``) runs them; see
``benchmarks/README.md``.
"""
