"""Ground floor: measuring a training run, for either loop.

instrument.py (StepTimer, ScalarWriter), sampler.py (utilisation), profiler.py (the
profiler window), dtypes.py (per-layer dtypes, shapes and FLOPs of a model).
"""
