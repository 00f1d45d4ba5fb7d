"""Ground floor: measuring a training run, for either loop.

instrument.py (StepTimer, ScalarWriter), dashboards.py (what TensorBoard's HParams
and Custom Scalars dashboards show), sampler.py (utilisation), profiler.py (the
profiler window), dtypes.py (per-layer dtypes, shapes and FLOPs of a model),
observe.py (one call of any model, layer by layer), layercost.py (each layer's cost
per policy), numerics.py (each layer's values against float16's range and bfloat16's
error), memory.py (the step's memory), policies.py (which dtype each layer computes
in, a built model's layers under another policy and back, and a per-layer plan as
the DTypePolicyMap a script applies), timer.py (the one timer: interleaved until
settled, budgets, bounds), gradkernels.py (the kernel rows timed in-process),
rewrite.py (what oneDNN's rewrite measured, for a script).
"""
