"""A quick look, in this process, at the weight-gradient kernels of a model's op
families under each dtype: the one fact a fresh machine needs before it times a
16-bit step, and the only one it cannot afford to learn from the step itself.

On a Sapphire Rapids, oneDNN runs float16's convolution weight gradient on its
reference kernel: 696 ms against float32's 3 ms at the kernel probe's shape
(tests/data/kernels/intel_spr_amx_recorded.json), and 13-17 s for one mixed_float16
step of the seed convnet. The kernel table (mpt/machine/kernels.py) knows this, but
it is measured in a child process (~10 s) and only read from its cache before step 1.
Without it, the first call of that step would be spent to learn what one kernel call
says. So where no table is cached, each family's weight-gradient op (the op a 16-bit
policy loses most on where a kernel is missing) is timed here, at the probe's shapes,
by the one timer (mpt/measure/timer.py) until its calls agree: about 0.2 s on a 2-core
Zen 4, a few seconds where the reference kernel runs. The rows have the kernel table's form (kernel names aside:
no ONEDNN_VERBOSE here), so that mpt/machine/fastpath.py reads them as it reads a
table.
"""

from typing import Any

import tensorflow as tf

from mpt.machine import kernels
from mpt.machine import probe_ops
from mpt.measure import timer

SOURCE = "the weight-gradient kernels timed in this process (no kernel table cached)"
BUDGET_S = 3.0  # The calls after the first ones, all of them: a reference kernel
# (~0.7 s a call) still settles.


def table(families, dtypes=kernels.DTYPES) -> dict[str, Any]:
  """The kernel table's rows for the weight-gradient op of each of `families`
  (probe_ops.FAMILIES' names) under each of `dtypes`, timed by the one timer (each
  op's dtypes interleaved, float32 first), with their ratios to float32's; an op that
  fails under a dtype is left out (a note says which)."""
  wanted = [op for op in probe_ops.WEIGHT_GRADIENTS
            if any(op in probe_ops.FAMILIES.get(f, ()) for f in families)]
  by_dtype = {d: probe_ops.ops(tf, d) for d in dtypes}
  rows, failed = [], []
  budget = timer.Budget(lambda timings: BUDGET_S * 1e3, "the kernels' budget")
  for op in wanted:
    found = timer.run([(d, lambda d=d: lambda: by_dtype[d][op]().numpy())
                       for d in dtypes], calls=budget,
                      catch=(tf.errors.OpError, ValueError, TypeError))
    for dtype, t in found.items():
      if t.failed or not t.ms:
        failed.append(f"{op} {dtype}: {t.stopped}")
      else:
        rows.append({"op": op, "dtype": dtype, "ms": round(t.ms, 4),
                     **({"bound": t.bound} if t.bound else {})})
  found = {"schema": kernels.SCHEMA, "source": SOURCE, "rows": kernels.with_ratios(rows)}
  if failed:
    found["note"] = "not timed: " + ", ".join(failed)
  return found
