"""Ground floor: measuring a training run, for either loop.

instrument.py (StepTimer, ScalarWriter), dashboards.py (what TensorBoard's HParams
and Custom Scalars dashboards show), sampler.py (utilisation), profiler.py (the
profiler window), dtypes.py (per-layer dtypes, shapes and FLOPs of a model).
"""
