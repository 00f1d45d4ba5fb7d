"""Detectors that read a GPU capture (mpt/diagnose/gpu_evidence.py): whether the GPU
waited on the host, whether float32 left Tensor Cores unused and what mixed_float16
could gain at most, what it cannot gain on a GPU without them, eligible ops a 16-bit
run left on CUDA cores, and memory-bound ops or transposes dominating.

Each takes a `GpuEvidence`, so it serves an mpt run with a GPU trace (through
detectors/__init__.py) and a foreign profile folder (mpt/diagnose/profile.py) alike.
"""

import collections

from mpt.diagnose.findings import Finding
from mpt.diagnose.gpu_evidence import GpuEvidence
from mpt.diagnose.thresholds import (BIG_BOUND, ELIGIBLE_SHARE, HOST_GAP_SHARE,
                                     INPUT_WAIT_SHARE, MEMORY_BOUND_SHARE,
                                     MISSED_TENSOR_CORES, TRANSPOSE_SHARE, UTILISATION)
from mpt.records.cost import times
from mpt.records.gpu import Kernel

BASED = ["gpu trace"]
CAUSES = ("channels, units or the batch not multiples of 8; the first convolution's 3 "
          "input channels; an NCHW layout that cuDNN transposes; a layer kept in float32")


def _gpu(g: GpuEvidence) -> str:
  d, c = g.profile.device, g.ceiling
  cc = ".".join(map(str, d.compute_capability or [])) or "?"
  return f"{c.gpu if c else d.name} (compute capability {cc}, {d.sms or '?'} SMs)"


def _layers(kernels: list[Kernel], total: float) -> str:
  by_layer = collections.Counter()
  for k in kernels:
    by_layer[k.layer or k.op_type or k.kernel[:40]] += k.ms
  return ", ".join(f"{layer} {ms:.2f} ms ({ms / total:.1%})"
                   for layer, ms in by_layer.most_common(5))


def idle(g: GpuEvidence) -> Finding | None:
  """The GPU waits on the host: input, Python, I/O. No precision shortens that."""
  p = g.profile
  busy, inputs, gaps = p.device_busy_share, p.input_share or 0.0, p.host_gap_share or 0.0
  starved = busy is not None and busy < UTILISATION
  if not (starved or inputs >= INPUT_WAIT_SHARE or gaps >= HOST_GAP_SHARE):
    return None
  evidence = [f"{p.step_ms:.1f} ms/step; the GPU ran kernels "
              + (f"{busy:.0%} of it" if busy is not None else "(busy share unknown)")
              + f"; waiting for input {inputs:.0%}, host gaps (Python, I/O) {gaps:.0%}"]
  if busy:
    evidence.append(f"mixed precision only shortens kernels: even kernels that took no "
                    f"time would make the step at most {times(1 / (1 - busy))} faster"
                    if busy < 1 else "the GPU was busy the whole step")
  if p.input_statement:
    evidence.append(f"xprof: {p.input_statement}")
  step = ("feed the GPU first: a larger --batch_size, --cache=memory, --jit_compile"
          if g.rerun else "feed the GPU first: dataset.prefetch(tf.data.AUTOTUNE) and "
          "cache(), model.compile(steps_per_execution=N), a larger batch")
  return Finding(
      "gpu_idle", "high" if starved or inputs >= 2 * INPUT_WAIT_SHARE else "medium",
      1 - busy if busy is not None else max(inputs, gaps),
      f"the GPU idles {1 - busy:.0%} of the step: mixed precision cannot speed that up"
      if busy is not None else "the step waits on the host",
      f"GPU busy < {UTILISATION:.0%} of the step, input wait >= {INPUT_WAIT_SHARE:.0%} "
      f"or host gaps >= {HOST_GAP_SHARE:.0%}", evidence, step, BASED)


def tensor_cores_unused(g: GpuEvidence) -> Finding | None:
  """float32 on a GPU with Tensor Cores (on CUDA cores, or on TF32 ones from Ampere
  on): the upper bound on mixed_float16's gain."""
  b, c = g.bound, g.ceiling
  if b is None or not c.tensor_cores:
    return None
  cuda, tf32 = b.shares["eligible_not_tc"], b.shares["tensor_core"] if b.tf32_ratio else 0
  if cuda < ELIGIBLE_SHARE and tf32 < ELIGIBLE_SHARE:
    return None
  eligible = [k for k in g.profile.kernels if k.eligible and not k.tensor_core]
  on_tf32 = (f" and {c.tf32_tflops:g} on TF32 Tensor Cores, at most "
             f"{times(b.tf32_ratio)} on ops already there" if b.tf32_ratio else "")
  ratio = (f"data sheet: float16 on Tensor Cores {c.float16_tflops:g} vs float32 "
           f"{c.float32_tflops:g} TFLOP/s on CUDA cores, at most {times(b.ratio)} on "
           f"eligible ops{on_tf32}" if b.ratio else
           f"{c.source}: the eligible ops are taken as free")
  step = (f", at most {times(b.step_bound)} faster steps at this capture's GPU busy "
          f"share ({g.profile.device_busy_share:.0%} of {g.profile.step_ms:.1f} ms; "
          f"less host time gains more, up to the kernels' bound)"
          if b.step_bound else "")
  evidence = [
      f"{_gpu(g)} has Tensor Cores; {ratio}",
      f"{cuda:.1%} of {g.kernel_ms:.1f} ms kernel time in ops Tensor Cores could run, "
      f"in float32 on CUDA cores (eligibility from {g.profile.eligible_from})"
      + (f"; {tf32:.1%} on TF32 Tensor Cores" if tf32 else "")
      + f"; memory-bound {b.shares['memory'] + b.shares['casts']:.1%}",
      f"upper bound (Amdahl): {b.formula}: at most {times(b.kernel_bound)} faster "
      f"kernels{step}; a bound, not a promise (casts, loss scaling and misaligned "
      f"shapes take some back)"]
  if eligible:
    evidence.append(f"most eligible time on CUDA cores: {_layers(eligible, g.kernel_ms)}")
  gain = 1 - 1 / (b.step_bound or b.kernel_bound)
  what = ("float32 leaves the Tensor Cores unused" if cuda >= tf32 else
          f"float32 runs {tf32:.0%} of its kernel time on TF32 Tensor Cores")
  return Finding(
      "tensor_cores_unused", "high" if (b.step_bound or 0) >= BIG_BOUND else "medium",
      gain, f"{what}: mixed_float16 at most {times(b.step_bound or b.kernel_bound)} "
      f"faster " + ("per step" if b.step_bound else "in kernel time"),
      f"a float32 capture on compute capability >= 7.0 with >= {ELIGIBLE_SHARE:.0%} "
      f"of kernel time in eligible ops on CUDA cores or on TF32 Tensor Cores",
      evidence, g.policy_step("mixed_float16") + ", then profile again", BASED)


def no_tensor_cores(g: GpuEvidence) -> Finding | None:
  """A GPU without Tensor Cores: only memory-bound ops can gain from 16 bits."""
  c = g.ceiling
  if c is None or c.tensor_cores is not False or not g.kernel_ms:
    return None
  s = g.profile.split
  eligible, memory = g.share(s.eligible_not_tc + s.tensor_core), g.share(s.memory_bound)
  most = 1 / (1 - memory / 2)
  busy = g.profile.device_busy_share
  step = f", {times(1 / (1 - (busy or 0) * memory / 2))} per step" if busy else ""
  rate = (f"float16 arithmetic runs at 1/{1 / c.ratio:.0f} of float32 here: 16-bit "
          f"math is slower" if c.ratio and c.ratio < 1 else
          f"its data sheet's float16 rate ({c.float16_tflops:g} vs {c.float32_tflops:g}"
          f" TFLOP/s, paired half on CUDA cores) is not what mixed_float16 gets: below "
          f"compute capability 7.0 tf.keras warns 'Your GPU may run slowly with dtype "
          f"policy mixed_float16'"
          if c.ratio else c.source)
  evidence = [f"{_gpu(g)}: no Tensor Cores; {rate}",
              f"convolutions and matmuls take {eligible:.1%} of {g.kernel_ms:.1f} ms "
              f"kernel time: 16 bits cannot speed them up here",
              f"memory-bound ops take {memory:.1%}: halving their bytes gains at most "
              f"{times(most)} in kernel time{step}"]
  if g.sixteen_bit:
    return Finding("no_tensor_cores", "high", eligible,
                   "a 16-bit run on a GPU without Tensor Cores", "compute capability "
                   "< 7.0 (no Tensor Cores)", evidence, g.policy_step("float32"), BASED)
  return Finding(
      "no_tensor_cores", "medium", 1 - 1 / most,
      f"no Tensor Cores: mixed_float16 is worth at most {times(most)} here (memory-bound "
      f"ops only)", "compute capability < 7.0 (no Tensor Cores)", evidence,
      "keep float32 on this GPU (mixed_float16 saves memory, for a larger batch, not "
      "time); for speed, a GPU with Tensor Cores (compute capability >= 7.0)", BASED)


def tensor_cores_missed(g: GpuEvidence) -> Finding | None:
  """A 16-bit run whose eligible ops ran on CUDA cores: the layers, the likely causes."""
  c = g.ceiling
  missed = [k for k in g.profile.kernels if k.eligible and not k.tensor_core]
  share = g.share(sum(k.ms for k in missed))
  if not g.sixteen_bit or not c or not c.tensor_cores or share < MISSED_TENSOR_CORES:
    return None
  in_f32 = g.share(sum(k.ms for k in missed if k.dtype == "float32"))
  evidence = [f"{share:.1%} of {g.kernel_ms:.1f} ms kernel time in convolutions and "
              f"matmuls that ran on CUDA cores on {_gpu(g)}"
              + (f" ({in_f32:.1%} of it in float32 kernels)" if in_f32 else ""),
              f"by layer: {_layers(missed, g.kernel_ms)}",
              f"layout transposes: {g.share(g.profile.by_family.get('transpose', 0)):.1%}"
              f" of kernel time", f"likely causes: {CAUSES}"]
  step = ("pad channels, units and the batch to multiples of 8 (the first "
          "convolution's 3 input channels to 4 or 8), keep NHWC"
          + ("; in mpt, --model=<model>_aligned where registered" if g.rerun else ""))
  return Finding("tensor_cores_missed", "high", share,
                 f"{share:.0%} of kernel time in eligible ops missed the Tensor Cores",
                 f"a 16-bit capture with >= {MISSED_TENSOR_CORES:.0%} of kernel time in "
                 f"eligible ops on CUDA cores", evidence, step, BASED)


def memory_bound(g: GpuEvidence) -> Finding | None:
  """Memory-bound ops (or layout transposes) take most of the kernel time."""
  fams = g.profile.by_family
  memory = g.share(g.profile.split.memory_bound)
  transpose = g.share(fams.get("transpose", 0.0))
  if memory < MEMORY_BOUND_SHARE and transpose < TRANSPOSE_SHARE:
    return None
  top = sorted(fams.items(), key=lambda f: -f[1])[:5]
  evidence = [f"memory-bound ops {memory:.1%} of {g.kernel_ms:.1f} ms kernel time: "
              + ", ".join(f"{f} {g.share(ms):.1%}" for f, ms in top)]
  if g.sixteen_bit:  # Already 16-bit: its casts are mixed precision's own cost.
    evidence.append(f"already 16-bit: precision has nothing more to give them; Cast "
                    f"kernels (mixed precision's own conversions) "
                    f"{g.share(fams.get('cast', 0.0)):.1%}")
  else:
    evidence.append(f"16 bits at most halve their bytes: at most "
                    f"{times(1 / (1 - memory / 2))} in kernel time from them")
  if transpose >= TRANSPOSE_SHARE:
    evidence.append(f"layout transposes {transpose:.1%}: NCHW <-> NHWC around cuDNN")
  step = ("fuse them: XLA (" + ("--jit_compile" if g.rerun else
                                 "model.compile(jit_compile=True)")
          + "), fused BatchNorm, channels-last (NHWC) layouts")
  return Finding("gpu_memory_bound", "medium", memory,
                 f"memory-bound GPU ops take {memory:.0%} of kernel time",
                 f"memory-bound ops >= {MEMORY_BOUND_SHARE:.0%} of kernel time or "
                 f"transposes >= {TRANSPOSE_SHARE:.0%}", evidence, step, BASED)


# The GPU rules in the order a diagnosis lists what it checked.
RULES = {"gpu_idle": idle, "tensor_cores_unused": tensor_cores_unused,
         "no_tensor_cores": no_tensor_cores, "tensor_cores_missed": tensor_cores_missed,
         "gpu_memory_bound": memory_bound}
