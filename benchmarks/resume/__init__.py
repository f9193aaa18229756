"""The parts of the resume-throughput benchmark; run it with ``python -m benchmarks.resume_throughput``.

- :mod:`~benchmarks.resume.workload`: what is generated (prompt groups, length distribution) and
  how it maps onto a snapshot;
- :mod:`~benchmarks.resume.engine_calls`: every call the benchmark makes on an engine;
- :mod:`~benchmarks.resume.measure`: clocks, token accounting, snapshot bytes, consistency and
  exactness checks;
- :mod:`~benchmarks.resume.phases`: the phases of one repetition;
- :mod:`~benchmarks.resume.report`: one repetition's figures, the sweep summary, the JSON result
  and its tables.
"""
