"""The parts of the resume-throughput benchmark; run it with ``python -m benchmarks.resume_throughput``.

- :mod:`~benchmarks.resume.workload`: what is generated (prompt groups, length distribution) and
  how it maps onto a snapshot;
- :mod:`~benchmarks.resume.engine_calls`: every call the benchmark makes on an engine (engines that
  time their steps, in this process or in Ray actors);
- :mod:`~benchmarks.resume.steps`: engine steps timed on the engine's side, and the decode steps a
  save costs an engine that is never paused;
- :mod:`~benchmarks.resume.measure`: clocks, token accounting, snapshot bytes, consistency and
  exactness checks;
- :mod:`~benchmarks.resume.phases`: the phases of one repetition;
- :mod:`~benchmarks.resume.figures`: one repetition's figures, the sweep summary, the table rows;
- :mod:`~benchmarks.resume.report`: the JSON result (with :mod:`benchmarks.provenance`) and its
  README tables.

Beside it, by engine count (``python -m benchmarks.resume.engines``), in the reference trainer's own
checkpoints (``python -m benchmarks.resume.trainer_saves``) and the noise-floor study
(``python -m benchmarks.resume.noise_floor``).
"""
