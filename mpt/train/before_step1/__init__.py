"""Room: what a run learns before its first step: measure, then choose. Imports
common/ only.

measure.py       the one entry: `before_step1()` -> `BeforeStep1` (each fact once)
cost.py          this model's step timed per policy by the one timer
                 (mpt/measure/timer.py): its budgets, PATHOLOGICAL rule and cache
scriptcost.py    a script's own step, timed by the same timer after its first step
layers.py        when each layer is timed per policy, and the line that says it
autopolicy.py    --policy=auto: the policy and per-layer plan measured fastest
onednn_choice.py TF's oneDNN rewrite, chosen in the supervisor before TF starts
preflight.py     will the step fit in memory? (the estimate per policy)
gpu_steps.py     on a GPU, each policy's step profiled into the kernel table
"""
