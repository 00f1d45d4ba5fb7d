"""The diagnosis' thresholds, in one place: each finding prints its own next to it, and
docs/diagnosis.md's table of findings states each one (tests/diagnose/test_diagnose.py
`DOC_WORDS` checks the page says them as they are). A new detector's cut-off goes here,
the words its row states it in go there.
"""

from mpt.machine import fastpath, gpu_table

INPUT_WAIT_SHARE = 0.10      # data-wait share of step time: input bound at or above
UTILISATION = 0.50           # busy share of the device below which a run is starved
MISALIGNED_SHARE = 0.05      # forward-FLOP share in layers with dims not multiples of 8
FLOAT32_FLOP_SHARE = 0.10    # forward-FLOP share left in float32 under a 16-bit policy
FLOAT32_TIME_SHARE = 0.10    # traced op time in float32 layers and casts
BATCHNORM_TIME_SHARE = 0.20  # traced op time in Keras' BatchNormalization layers
SKIPPED_SHARE = 0.02         # skipped (non-finite) steps, share of steps run ...
SETTLING_SKIPS = 2           # ... beyond these: a dynamic scale starts at 2**15 and
                             # halves (skipping a step) until the gradients fit
SMALL_STEP_MS = 30.0         # a step this short is mostly per-op launch overhead
OTHERS_SHARE = 0.25          # share of the CPU other processes used: a shared machine
MIN_SCALE = 1.0              # a dynamic loss scale below this has collapsed
ACHIEVED_VS_MICROBENCH = 0.10  # achieved FLOP rate / measured matmul rate
MEMORY_DISAGREEMENT = 0.30  # |memory estimate / measured peak - 1|
SLOWER_THAN_FLOAT32 = 1.0    # 16-bit speed-up over float32 below this: no gain
HIGH_LOSS = 3.0              # a 16-bit run measured this many times float32's time:
                             # its finding is high and ranked first
SLOW_KERNELS = fastpath.SLOW  # the probe's time over float32's for this model's ops
                             # from which the policy's kernels are slow (2x)
OPPORTUNITY = 1.3            # another policy's measured op time this many times
                             # faster than the run's: worth switching
XLA_MARGIN = 0.20           # a run with XLA whose step measured this much slower
                            # than without it before step 1
ONEDNN_MARGIN = 0.10         # the oneDNN setting a run ran measured this much slower
                             # than the other: worth switching
# Numerics (numerics.json, mpt/diagnose/detectors/numerics.py).
UNDERFLOW_SHARE = 0.01       # of a layer's nonzero gradients below 2^-24 at the loss
                             # scale: float16 flushes them to zero
SCALE_FALL = 16.0            # a dynamic loss scale this many times lower at the end
                             # than after warm-up has kept falling
SCALE_HEADROOM = 256.0       # a loss scale this many times below the largest the
                             # gradients allow, while some underflow: far below
BF16_ERROR = 0.01            # relative error bfloat16 leaves in a layer's output that
                             # is or feeds a reduction
# GPU captures (mpt/diagnose/detectors/gpu.py); shares of the capture's kernel time
# unless said otherwise.
SIXTEEN_BIT_RUN = 0.25       # in 16-bit kernels: a capture of a 16-bit run (where no
                             # run folder says the policy)
ELIGIBLE_SHARE = 0.10        # in Tensor-Core-eligible ops run in float32 on CUDA cores
MISSED_TENSOR_CORES = gpu_table.MISSED  # in eligible ops a 16-bit run left on
                                        # CUDA cores (the up-front warning's too)
MEMORY_BOUND_SHARE = 0.50    # in memory-bound ops (BatchNorm, elementwise, casts, ...)
TRANSPOSE_SHARE = 0.10       # in layout transposes (NCHW <-> NHWC)
HOST_GAP_SHARE = 0.25        # of step time in host gaps (Python, I/O: xprof's "All
                             # others"), with UTILISATION and INPUT_WAIT_SHARE for the
                             # GPU's busy and input-wait shares
BIG_BOUND = 1.5              # mixed_float16's step bound from which Tensor Cores left
                             # unused is a high finding
SCALING = 0.5                # a sweep's step-time growth / batch growth below this:
                             # per-step overhead dominates (mpt/diagnose/sweep.py)
