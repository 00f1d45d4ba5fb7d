"""The diagnosis' detectors: each reads one kind of measured evidence from a run folder
and returns a `Finding` (or None), with its threshold, its numbers, a next step and
the kinds of evidence it rests on (`BASES`).

Pure functions over the evidence mpt/diagnose/evidence.py reads (summary.json with its
`kernels` verdict, flags.txt, dtypes.json, the profiler's op statistics, a float32 run
of the same configuration): no TensorFlow here, so the detectors are tested on
recorded run folders and on their threshold edges (tests/diagnose/test_diagnose.py).

Measurement outranks the CPU flags: when the kernel probe measured the run's kernels
(summary.json `kernels`, evidence "probe"), `slow_kernel` and `opportunity` say which
op runs slow and which policy is measured fastest, and `hardware` (the flags' rule)
stays silent. A 16-bit run measured >= HIGH_LOSS times float32's time is "high" and
ranked first. mpt/diagnose/diagnosis.py ranks the findings, mpt/diagnose/report.py
reports them.
"""

import dataclasses
from typing import Callable

from mpt.diagnose import evidence as evidence_lib
from mpt.diagnose import opstats
from mpt.diagnose.evidence import Evidence
from mpt.machine import fastpath
from mpt.machine import hardware as hardware_lib
from mpt.machine import kernels as kernels_lib

# Thresholds, in one place: the report prints each next to its finding.
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
ONEDNN_MARGIN = 0.10         # the oneDNN setting a run ran measured this much slower
                             # than the other: worth switching

SEVERITY = ("high", "medium", "low")
SIXTEEN = hardware_lib.SIXTEEN
# What a finding rests on (`Finding.based_on`), most direct first.
BASES = ("sibling runs",        # a float32 run next to it / the sweep's other cells
         "step cost",           # the model's step timed per policy before step 1
                                # (summary.json cost, mpt/train/cost.py)
         "probe",               # the kernel probe's measured table (summary.json kernels)
         "trace",               # the profiler trace's op statistics (op_stats.json)
         "step timing",         # this run's step and data-wait times (summary.json)
         "utilisation",         # the CPU/GPU utilisation sampler
         "dtypes",              # dtypes.json: per-layer dtypes, dims and FLOPs
         "loss scale",          # the loss scale and skipped steps
         "memory",              # the memory estimate and the measured peak
         "microbenchmark",      # --mode=microbench's matmul rates
         "flags",               # the CPU's feature flags (no measurement)
         "compute capability")  # the GPU's compute capability and TF32 switch


@dataclasses.dataclass
class Finding:
  id: str
  severity: str     # high, medium, low
  impact: float     # rough share of step time at stake; ranks within a severity
  title: str
  threshold: str
  evidence: list[str]
  next_step: str
  based_on: list[str] = dataclasses.field(default_factory=list)  # names from BASES
  # The measured time over float32's this finding explains (a 16-bit run), or None;
  # HIGH_LOSS or more ranks it first.
  slowdown: float | None = None


def _loss_severity(loss: float | None, unmeasured: str = "high") -> str:
  """Severity follows the measured loss against float32."""
  if loss is None:
    return unmeasured
  if loss >= HIGH_LOSS:
    return "high"
  return "medium" if loss > SLOWER_THAN_FLOAT32 else "low"


def _x(v: float) -> str:
  """A ratio as "231x", "22.3x", "0.1x"."""
  return f"{v:.3g}x"


def _base(k: dict) -> str:
  """The BASES name of the measurement a verdict rests on."""
  return "step cost" if k.get("evidence") == "cost" else "probe"


def _ratios_line(k: dict) -> str:
  """Each policy's measured time over float32's for this model's ops, fastest first."""
  ratios = sorted((k.get("policy_ratios") or {}).items(), key=lambda i: i[1])
  what = ("this model's step timed per policy before step 1" if _base(k) == "step cost"
          else "kernel probe")
  return (f"{what} ({k.get('source') or 'probe'}), this model's ops: "
          + ", ".join(f"{p} {_x(r)}" for p, r in ratios) + " float32's time")


def _baseline_line(ev: Evidence) -> str:
  s, b = ev.summary, ev.baseline
  if not b:
    return ("no float32 run of this configuration next to this one: measure it with "
            "the same flags and --policy=float32")
  x = evidence_lib.speedup(ev)
  same_loop = "" if b.get("loop") == s.get("loop") else f" ({b.get('loop')} loop)"
  return (f"{s['ms_per_step']:.1f} ms/step vs {b['ms_per_step']:.1f} under float32"
          f"{same_loop} in {b.get('run_dir')}: {x:.2f}x the float32 speed"
          + (f" ({1 / x:.1f} times slower)" if x < 1 else ""))


def hardware(ev: Evidence) -> Finding | None:
  """No fast 16-bit path for the policy on this device, by the CPU flags or the GPU's
  compute capability: only when the kernel probe did not measure it (then
  `slow_kernel` and `opportunity` decide from the measurement)."""
  s, caps = ev.summary, evidence_lib.gpu_caps(ev.summary)
  if evidence_lib.kernels(ev):
    return None
  found = evidence_lib.no_fast_path(s)
  if not found:
    return None
  reason, better = found
  half = SIXTEEN[s['policy']]
  evidence = [reason, _baseline_line(ev)]
  based_on = ["compute capability" if caps else "flags"]
  if ev.baseline:
    based_on.insert(0, "sibling runs")
  mb = s.get("microbench_gflops_by_dtype") or {}
  if not caps and mb.get(half) and mb.get("float32"):
    evidence.append(f"matmul microbenchmark on this machine: {half} {mb[half]:.1f} vs "
                    f"float32 {mb['float32']:.1f} GFLOP/s "
                    f"({mb[half] / mb['float32']:.2f}x)")
    based_on.append("microbenchmark")
  top = (ev.op_stats or {}).get("top_ops") or []
  if top:
    evidence.append("most traced op time: " + ", ".join(
        f"{o['type']} {o['share']:.1%}" for o in top[:4]))
    based_on.append("trace")
  x = evidence_lib.speedup(ev)
  loss = 1 / x if x else None
  if better == "float32":
    step = "--policy=float32"
    if not caps and half == "float16":
      step += (" (mixed_bfloat16 is the 16-bit policy CPUs run fast, but only with "
               "AVX512_BF16 or AMX-BF16; this CPU has neither)")
    elif not caps:
      step += " (or a CPU with AVX512_BF16 / AMX-BF16, e.g. Sapphire Rapids or Zen 4)"
    else:
      step += (" (or a GPU with compute capability >= 7.0 for float16, >= 8.0 for "
               "bfloat16)")
  else:
    step = f"--policy={better}"
  return Finding("hardware", _loss_severity(loss), 1 - x if x and x < 1 else 0.5,
                 f"{half} has no fast path on this {'GPU' if caps else 'CPU'}",
                 "the device lacks the 16-bit instructions or Tensor Cores (no kernel "
                 f"probe recorded); high when unmeasured or measured >= {HIGH_LOSS:g}x "
                 "float32's time", evidence, step, based_on, loss)


def _slow_words(k: dict, half: str) -> tuple[str, str]:
  """(the slow-kernel finding's title, its first line of evidence): the worst op and
  its kernel where the kernel table names them, else the step's measured ratio."""
  if not k.get("op"):
    return (f"{half} runs slow here: this model's step {_x(k['ratio'])} float32's time",
            f"{half}: this model's step measured {_x(k['ratio'])} float32's time before "
            f"step 1 (no kernel table names the op: --mode=microbench lists each op's "
            f"kernel)")
  ratio = f", {_x(k['op_ratio'])} float32's time" if k.get("op_ratio") else ""
  short = "oneDNN's reference kernel" if k.get("reference") else k.get("impl") or "?"
  kernel = (k.get("impl") or "an unknown kernel") + (
      " (oneDNN's reference kernel)" if k.get("reference") else "")
  return (f"{half} {k['op']} runs a slow kernel here: {short}{ratio}",
          f"{half} {k['op']} runs {kernel}{ratio}")


def slow_kernel(ev: Evidence) -> Finding | None:
  """The kernel probe measured this 16-bit policy's ops >= SLOW_KERNELS times
  float32's here (summary.json `kernels`): names the worst op, its kernel and its
  share of the trace, and reruns the run under the policy measured fastest."""
  s, k = ev.summary, evidence_lib.kernels(ev)
  policy = s.get("policy")
  if not k or policy not in SIXTEEN or not k.get("slow"):
    return None
  found = evidence_lib.slowdown(ev)
  if not found:
    return None
  loss, measured_by = found
  if loss <= SLOWER_THAN_FLOAT32:
    return None  # The run itself was not slower than float32 next to it.
  half, op = SIXTEEN[policy], k.get("op") or "?"
  fastest = k.get("fastest") or "float32"
  if fastest == policy:
    fastest = "float32"
  title, line = _slow_words(k, half)
  share = evidence_lib.traced_share(ev, op)
  top = (ev.op_stats or {}).get("top_ops") or []
  if share is not None:
    line += f"; {share:.1%} of traced op time"
  evidence = [line]
  if top and opstats.canonical_type(top[0]["type"]) != opstats.canonical_type(
      op.split("/")[0]):
    evidence.append("most traced op time: " + ", ".join(
        f"{o['type']} {o['share']:.1%}" for o in top[:4]))
  if measured_by == "sibling runs":
    evidence.append(_baseline_line(ev))
  else:
    evidence.append(f"{policy}: this model's ops measured {_x(loss)} float32's time in "
                    f"the {'step timing' if _base(k) == 'step cost' else 'kernel probe'}"
                    f"; " + _baseline_line(ev))
  ratios = k.get("policy_ratios") or {}
  evidence.append(_ratios_line(k) + (
      f"; {fastest} is {_x(ratios[policy] / ratios[fastest])} faster than {policy} "
      f"for these ops" if ratios.get(policy) and ratios.get(fastest) else ""))
  if k.get("contradicts"):
    evidence.append(f"{k['contradicts']}: the diagnosis follows the measurement")
  based_on = [_base(k)] + (["trace"] if top else [])
  if measured_by == "sibling runs":
    based_on.insert(0, "sibling runs")
  if k.get("contradicts"):
    based_on.append("flags")
  return Finding(
      f"slow_kernel:{half}", _loss_severity(loss), 1 - 1 / loss, title,
      f"the {'step timing' if _base(k) == 'step cost' else 'kernel probe'} measured "
      f"this model's ops >= {SLOW_KERNELS:g}x float32's "
      f"time; high from {HIGH_LOSS:g}x measured (the float32 run next to it, else the "
      f"probe)", evidence, evidence_lib.rerun(ev, fastest), based_on, loss)


# The op types the kernel probe measures, as a trace names them.
_PROBED = {opstats.canonical_type(op.split("/")[0])
           for family, ops in kernels_lib.FAMILIES.items() if family != "cast"
           for op in ops}


def opportunity(ev: Evidence) -> Finding | None:
  """Another policy measured >= OPPORTUNITY times faster than this run's for this
  model's ops on this machine (the kernel probe); float32 runs included."""
  s, k = ev.summary, evidence_lib.kernels(ev)
  policy = s.get("policy")
  ratios = (k or {}).get("policy_ratios") or {}
  if not ratios.get(policy) or slow_kernel(ev):  # Slow kernels: the same advice there.
    return None
  others = {p: r for p, r in ratios.items() if p != policy and r}
  if not others:
    return None
  best = min(others, key=others.get)
  gain = ratios[policy] / others[best]
  if gain < OPPORTUNITY:
    return None
  choice = s.get("policy_choice") or {}
  if choice.get("chosen") == policy:
    return None  # --policy=auto timed the real model under each policy and chose this.
  x = evidence_lib.speedup(ev)
  if best == "float32" and x and x >= SLOWER_THAN_FLOAT32:
    return None  # The float32 run next to it measured slower than this one.
  evidence = [_ratios_line(k) + f": {best} takes {_x(1 / gain)} of {policy}'s time"]
  top = (ev.op_stats or {}).get("top_ops") or []
  based_on = [_base(k)]
  expected = gain
  if top and _base(k) == "probe":  # The step's timing covers all of the step.
    covered = sum(o["share"] for o in top if opstats.canonical_type(o["type"]) in _PROBED)
    expected = 1 / ((1 - covered) + covered / gain)
    evidence.append(f"the probed op types hold {covered:.1%} of this run's traced op time"
                    f": expect about {_x(expected)} this run's speed under {best} (the "
                    f"rest of the step does not speed up)")
    based_on.append("trace")
  elif _base(k) == "step cost":
    evidence.append(f"expect about {_x(gain)} this run's speed under {best}: the whole "
                    f"step was timed")
    if top:
      based_on.append("trace")
  else:
    evidence.append(f"expect up to {_x(gain)} this run's speed under {best} if these ops "
                    f"take the step's time (--profile_steps=A,B shows their share)")
  loss = None
  if policy in SIXTEEN:
    found = evidence_lib.slowdown(ev)
    if found and found[1] == "sibling runs":
      loss = found[0]
      evidence.append(_baseline_line(ev))
      based_on.insert(0, "sibling runs")
  # High when the run measured >= HIGH_LOSS slower; low when the trace shows the
  # probed ops hold too little of the step for the gain to show.
  severity = ("high" if loss and loss >= HIGH_LOSS else
              "low" if expected < OPPORTUNITY else "medium")
  return Finding(
      f"opportunity:{best}", severity, 1 - 1 / expected,
      f"{best} measured {_x(gain)} faster than {policy} for this model's ops here",
      f"another policy's op time in the kernel probe >= {OPPORTUNITY:g}x faster than "
      f"this run's (low when the traced share of those ops leaves less than "
      f"{OPPORTUNITY:g}x)", evidence, evidence_lib.rerun(ev, best), based_on, loss)


def tf32(ev: Evidence) -> Finding | None:
  """float32 on Ampere or newer runs matmuls as TF32: the baseline is not plain FP32."""
  caps = evidence_lib.gpu_caps(ev.summary)
  if not (ev.summary.get("hardware") or {}).get("tf32") or not caps or min(caps) < (8, 0):
    return None
  cc = ".".join(map(str, min(caps)))
  return Finding(
      "tf32", "low", 0.0, "float32 matmuls run as TF32 on Tensor Cores",
      "compute capability >= 8.0 with TF32 enabled (TensorFlow's default)",
      [f"GPU compute capability {cc}, TF32 enabled: the float32 baseline already uses "
       f"Tensor Cores, so a 16-bit policy gains less over it than data-sheet FP32 "
       f"figures suggest"],
      "--notf32 for a plain FP32 baseline (slower, full float32 mantissa)",
      ["compute capability"])


def input_bound(ev: Evidence) -> Finding | None:
  s = ev.summary
  share = s.get("data_wait_share")
  if share is None or share < INPUT_WAIT_SHARE:
    return None
  wait = (s.get("step_time_ms") or {}).get("data_wait_ms_median")
  evidence = [f"{share:.1%} of step time waiting for the next batch"
              + (f" (median {wait:.1f} ms of a {s['ms_per_step']:.1f} ms step)"
                 if wait is not None and s.get("ms_per_step") else "")]
  busy, what = evidence_lib.busy(s)
  based_on = ["step timing"]
  if busy is not None:
    evidence.append(f"{what}: {busy:.0%}")
    based_on.append("utilisation")
  work, cache = ev.flags.get("input_work", 0), ev.flags.get("cache", "memory")
  if work:
    step = f"drop --input_work={work} (the per-example blur passes it adds)"
  elif cache == "none":
    step = "--cache=memory (decoding and resizing run every epoch otherwise)"
  else:
    step = ("move per-example work out of the training stream (precompute it, or "
            "cache after it), or give the input pipeline its own cores")
  return Finding("input_bound", "high" if share >= 2 * INPUT_WAIT_SHARE else "medium",
                 share, "input bound: steps wait for data",
                 f"data-wait share >= {INPUT_WAIT_SHARE:.0%} of step time",
                 evidence, step, based_on)


def low_utilisation(ev: Evidence) -> Finding | None:
  """The device idles while the input pipeline keeps up: per-step overhead (short
  steps) or ops that do not use the device fully (long steps)."""
  s = ev.summary
  busy, what = evidence_lib.busy(s)
  share = s.get("data_wait_share") or 0.0
  if busy is None or busy >= UTILISATION or share >= INPUT_WAIT_SHARE:
    return None
  if (evidence_lib.others(s) or 0.0) >= OTHERS_SHARE:
    return None  # Not idle: other processes had the cores (see `shared_machine`).
  ms = s.get("ms_per_step") or 0.0
  evidence = [f"{what}: {busy:.0%} while waiting for data only {share:.1%} of the time",
              f"{ms:.1f} ms/step at batch {s.get('batch_size')}"
              + (f", {s['flops_per_step'] / 1e9:.2f} GFLOP per step"
                 if s.get("flops_per_step") else "")]
  jit = ev.flags.get("jit_compile")
  evidence.append("XLA on" if jit else "XLA off")
  if ms < SMALL_STEP_MS:
    title = "overhead bound: steps too small to keep the device busy"
    step = f"--batch_size={2 * (s.get('batch_size') or 16)} (more work per step)"
    step += "" if jit else " or --jit_compile (fewer, fused ops per step)"
  else:
    title = "the device is idle part of each step"
    step = ("--profile_steps=A,B, then --mode=diagnose: the op statistics show which "
            "ops run long (single-threaded kernels keep the other cores idle)")
  return Finding("low_utilisation", "medium", 1 - busy, title,
                 f"utilisation < {UTILISATION:.0%} with data wait < "
                 f"{INPUT_WAIT_SHARE:.0%}; steps < {SMALL_STEP_MS:g} ms count as "
                 f"overhead", evidence, step, ["utilisation", "step timing"])


def shared_machine(ev: Evidence) -> Finding | None:
  """Other processes used the CPU during the run: its timings are inflated."""
  s = ev.summary
  others = evidence_lib.others(s)
  # On a GPU the CPU runs only the input pipeline, which `input_bound` watches.
  if others is None or others < OTHERS_SHARE or (s.get("hardware") or {}).get("gpus"):
    return None
  busy, what = evidence_lib.busy(s)
  return Finding(
      "shared_machine", "medium", others, "other processes competed for the CPU",
      f"other processes' share of all cores >= {OTHERS_SHARE:.0%} during the run",
      [f"the whole machine was {s['util']['system_cpu_percent']['mean']:.0f}% busy, "
       f"this run {busy:.0%} of it ({what}): others took {others:.0%}"],
      "rerun when the machine is quiet before comparing ms/step; a sweep compares "
      "cells run one after another, so check theirs too", ["utilisation"])


def misaligned(ev: Evidence) -> Finding | None:
  s, d = ev.summary, ev.dtypes
  if s.get("policy") not in SIXTEEN or not d:
    return None
  names = d.get("misaligned_layers", [])
  share = d.get("misaligned_flops_share", 0.0)
  layer_time = (ev.op_stats or {}).get("layer_time_share", {})
  time_share = sum(layer_time.get(n, 0.0) for n in names)
  per_replica = s.get("per_replica_batch") or s.get("batch_size") or 0
  shapes = max(share, time_share) >= MISALIGNED_SHARE
  if not shapes and per_replica % 8 == 0:
    return None
  evidence = [f"{l['name']} ({l['class']}, {l['dims']}): {l['flops_share']:.1%} of "
              f"forward FLOPs" + (f", {l['time_share']:.1%} of traced op time"
                                  if l["time_share"] is not None else "")
              for l in evidence_lib.layer_shares(ev, names)]
  evidence.append(f"{share:.1%} of forward FLOPs" + (
      f" and {time_share:.1%} of traced op time" if layer_time else "")
      + " in layers whose channels/units are not multiples of 8")
  if per_replica % 8:
    evidence.append(f"batch size {per_replica} per replica is not a multiple of 8")
  aligned = f"{s.get('model')}_aligned"
  if shapes and aligned in ev.model_names:
    step = f"--model={aligned} (pads the input channels to 8)"
  elif shapes:
    step = ("pad the misaligned layers' channels/units to multiples of 8 (as "
            "PadChannels in mpt/models/convnets.py does)")
  else:
    step = f"--batch_size={(per_replica // 8 + 1) * 8 * (s.get('replicas') or 1)}"
  return Finding("misaligned", "medium", max(share, time_share),
                 "misaligned shapes for 16-bit units",
                 f"misaligned share of forward FLOPs or of traced op time >= "
                 f"{MISALIGNED_SHARE:.0%}, or a batch not a multiple of 8", evidence,
                 step, ["dtypes"] + (["trace"] if layer_time else []))


def float32_work(ev: Evidence) -> Finding | None:
  s, d, ops = ev.summary, ev.dtypes, ev.op_stats or {}
  if s.get("policy") not in SIXTEEN or not d:
    return None
  flop_share = d.get("flops_share_32bit", 0.0)
  time_share = ops.get("float32_time_share", 0.0) + ops.get("cast_time_share", 0.0)
  if flop_share < FLOAT32_FLOP_SHARE and time_share < FLOAT32_TIME_SHARE:
    return None
  layers = sorted(d.get("float32_layers", []), key=lambda l: -l["flops_share"])
  evidence = [f"{flop_share:.1%} of forward FLOPs run in float32: " + ", ".join(
      f"{l['name']} {l['flops_share']:.1%}" for l in layers[:5])]
  if ops:
    evidence.append(f"traced op time: {ops.get('float32_time_share', 0):.1%} in "
                    f"float32 layers, {ops.get('cast_time_share', 0):.1%} in Cast ops")
  reasons = {l["reason"] for l in layers}
  if any("BatchNormalization" in r for r in reasons):
    step = ("BatchNorm normalises in float32 on purpose; --batchnorm=fused does it in "
            "TF's fused kernel, which reads and writes the 16-bit dtype (no casts)")
  else:
    step = "keep only the output layer in float32; drop other forced-float32 dtypes"
  return Finding("float32_work", "medium", max(flop_share, time_share),
                 "32-bit work left under a 16-bit policy",
                 f"float32 FLOP share >= {FLOAT32_FLOP_SHARE:.0%} or traced float32 + "
                 f"cast time >= {FLOAT32_TIME_SHARE:.0%}", evidence, step,
                 ["dtypes"] + (["trace"] if ops else []))


def batchnorm_cost(ev: Evidence) -> Finding | None:
  """Keras' BatchNormalization is separate float32 ops and casts: on a CPU with fast
  16-bit kernels it can be half of a step, which TF's fused kernel mostly removes."""
  s, d, ops = ev.summary, ev.dtypes or {}, ev.op_stats or {}
  shares = ops.get("layer_time_share") or {}
  bn = [l["name"] for l in d.get("layers", []) if l["class"] == "BatchNormalization"]
  share = sum(shares.get(name, 0.0) for name in bn)
  if s.get("batchnorm", "keras") != "keras" or share < BATCHNORM_TIME_SHARE:
    return None
  evidence = [f"{share:.1%} of traced op time is in the {len(bn)} BatchNormalization "
              f"layer(s): " + ", ".join(f"{n} {shares.get(n, 0):.1%}" for n in bn[:6])]
  based = ["trace", "dtypes"]
  other = ev.other_batchnorm
  if other and other.get("batchnorm") == "fused" and s.get("ms_per_step"):
    evidence.append(f"the same run with --batchnorm=fused next to it: "
                    f"{other['ms_per_step']:.1f} ms/step vs {s['ms_per_step']:.1f} "
                    f"({s['ms_per_step'] / other['ms_per_step']:.2f}x faster) in "
                    f"{other.get('run_dir')}")
    based.append("sibling runs")
  command = (f"python -m mpt.main --flagfile={ev.run_dir}/flags.txt --batchnorm=fused"
             if ev.run_dir else "--batchnorm=fused")
  return Finding("batchnorm_cost", "medium", share,
                 f"BatchNormalization takes {share:.0%} of the traced step",
                 f"traced op time in Keras' BatchNormalization layers >= "
                 f"{BATCHNORM_TIME_SHARE:.0%}", evidence,
                 f"{command} (TF's fused kernel: same variables and math, one op "
                 f"forward and one backward)", based)


def loss_scale(ev: Evidence) -> Finding | None:
  s = ev.summary
  steps, skipped, scale = s.get("steps") or 0, s.get("skipped_steps") or 0, s.get("loss_scale")
  excess = max(0, skipped - SETTLING_SKIPS)
  diverged = s.get("status") == "diverged"
  low = scale is not None and scale < MIN_SCALE and s.get("policy") == "mixed_float16"
  if not (diverged or low or (steps and excess / steps >= SKIPPED_SHARE)):
    return None
  evidence = [f"{skipped} of {steps} steps skipped for non-finite gradients, "
              f"{excess} beyond the first {SETTLING_SKIPS} ({excess / steps:.1%})"
              if steps else "no steps ran"]
  if scale is not None:
    evidence.append(f"final loss scale {scale:g}")
  if diverged:
    evidence.append(s.get("message") or "the run stopped as diverged")
  if s.get("policy") == "mixed_float16":
    step = ("find the layer that overflows (--mode=inspect), keep it in float32; or "
            "a fixed --loss_scale, or a lower --learning_rate")
  else:
    step = "lower --learning_rate; check the data for NaN/Inf"
  return Finding("loss_scale", "high" if diverged or low else "medium",
                 excess / steps if steps else 1.0, "loss-scale trouble",
                 f"skipped steps beyond the first {SETTLING_SKIPS} >= "
                 f"{SKIPPED_SHARE:.0%} of steps, scale < {MIN_SCALE:g}, or a NaN/Inf "
                 f"loss", evidence, step, ["loss scale"])


def favoured_policy(ev: Evidence) -> tuple[str, str] | None:
  """(the policy the evidence favours over this run's, what that rests on), for a run
  with no measurement before step 1: the fastest sibling run of the same
  configuration (a 16-bit one only where the CPU flags give it a fast path), else the
  CPU flags / compute capability."""
  s = ev.summary
  times = {p: o["ms_per_step"] for p, o in ev.siblings.items()
           if o.get("ms_per_step") and (p == "float32" or not no_fast_path_here(s, p))}
  if times:
    best = min(times, key=times.get)
    flags = (f"; the CPU flags give {SIXTEEN[best]} a fast path" if best in SIXTEEN
             else "")
    return best, (f"its sibling run under {best} measured {times[best]:.1f} ms/step "
                  f"next to this one's {s['ms_per_step']:.1f}{flags}")
  for policy in ("mixed_bfloat16", "mixed_float16", "float32"):
    if policy != s.get("policy") and not no_fast_path_here(s, policy):
      return policy, ("the CPU flags / compute capability give it a fast path; no run "
                      "of it next to this one measured it")
  return None


def no_fast_path_here(s: dict, policy: str) -> bool:
  return policy in SIXTEEN and evidence_lib.no_fast_path(s, policy) is not None


def slower_than_float32(ev: Evidence) -> Finding | None:
  """A 16-bit run measured slower than the float32 run next to it, which neither the
  CPU flags / compute capability (`hardware`) nor a measurement before step 1
  (`slow_kernel`, `opportunity`) explain. Without such a measurement, a run HIGH_LOSS
  or more times slower gets the policy the evidence favours as its next step."""
  s = ev.summary
  x = evidence_lib.speedup(ev)
  if s.get("policy") not in SIXTEEN or x is None or x >= SLOWER_THAN_FLOAT32:
    return None
  if hardware(ev) or slow_kernel(ev) or opportunity(ev):  # Explained there.
    return None
  evidence, based_on = [_baseline_line(ev)], ["sibling runs"]
  step = _where_time_goes(ev)
  k = evidence_lib.kernels(ev)
  if k:
    evidence.append(f"the {'step timing' if _base(k) == 'step cost' else 'kernel probe'}"
                    f" measured this model's ops at {_x(k['ratio'])} "
                    f"float32's time under {s['policy']}: the kernels do not explain the "
                    f"loss, the rest of the step does (casts, per-op overhead, input)")
    based_on.append(_base(k))
    step = (f"{evidence_lib.rerun(ev, 'float32')} (measured faster next to it); to see "
            f"where the time goes: " + _where_time_goes(ev, advice=False))
  elif 1 / x >= HIGH_LOSS:
    favoured = favoured_policy(ev)
    if favoured:
      evidence.append(f"nothing was measured before step 1 (a run made before mpt timed "
                      f"the step per policy); {favoured[1]}")
      step = (f"{evidence_lib.rerun(ev, favoured[0])}: the policy the evidence favours "
              f"({favoured[1]}); " + _where_time_goes(ev, advice=False))
      based_on.append("flags")
  if (ev.op_stats or {}).get("top_ops"):
    based_on.append("trace")
  return Finding("no_speedup", _loss_severity(1 / x), 1 - x, "no speed-up over float32",
                 f"speed-up over float32 < {SLOWER_THAN_FLOAT32:g}x; high from "
                 f"{HIGH_LOSS:g}x float32's time", evidence, step, based_on, 1 / x)


def onednn(ev: Evidence) -> Finding | None:
  """The run trained with TF's oneDNN rewrite in the setting measured slower for its
  policy (summary.json `onednn_choice`: both settings measured before step 1)."""
  s, choice = ev.summary, ev.summary.get("onednn_choice") or {}
  ms, ran = choice.get("measured_ms") or {}, s.get("onednn")
  other = {"on": "off", "off": "on"}.get(ran)
  if not other or not ms.get(ran) or not ms.get(other):
    return None
  loss = ms[ran] / ms[other]
  if loss < 1 + ONEDNN_MARGIN:
    return None
  return Finding(
      "onednn", "high" if loss >= HIGH_LOSS else "medium", 1 - 1 / loss,
      f"TF's oneDNN rewrite was {ran}, measured {_x(loss)} slower than {other} here",
      f"the setting the run trained with measured >= {1 + ONEDNN_MARGIN:g}x the other "
      f"for this model's step before step 1",
      [f"this model's step measured ~{ms['on']:.0f} ms/step with the rewrite on, "
       f"~{ms['off']:.0f} off; the run had it {ran} ({choice.get('why') or '?'}; "
       f"TF_ENABLE_ONEDNN_OPTS={s.get('tf_enable_onednn_opts') or 'unset'})"],
      f"{evidence_lib.rerun(ev, s['policy'])} --onednn={other}", ["step cost"], None)


def achieved_rate(ev: Evidence) -> Finding | None:
  s = ev.summary
  ratio = s.get("achieved_vs_microbench")
  if ratio is None or ratio >= ACHIEVED_VS_MICROBENCH:
    return None
  return Finding(
      "achieved_rate", "low", 1 - ratio, "far below the measured matmul rate",
      f"achieved FLOP rate < {ACHIEVED_VS_MICROBENCH:.0%} of the microbenchmark's",
      [f"{s['achieved_gflops']:.1f} GFLOP/s achieved vs {s['microbench_gflops']:.1f} "
       f"GFLOP/s measured for {s.get('compute_dtype')} matmuls ({ratio:.0%})"],
      _where_time_goes(ev),
      ["microbenchmark"] + (["trace"] if (ev.op_stats or {}).get("top_ops") else []))


def memory_estimate(ev: Evidence) -> Finding | None:
  """The preflight's memory estimate and the measured peak disagree by more than
  MEMORY_DISAGREEMENT: the largest-batch advice before the next run is that far off."""
  mem = ev.summary.get("memory") or {}
  ratio = mem.get("estimate_over_measured")
  if ratio is None or abs(ratio - 1) <= MEMORY_DISAGREEMENT:
    return None
  est = mem["estimate"]
  peak = mem.get("gpu_peak_mb") or mem["peak_rss_mb"]
  return Finding(
      "memory_estimate", "low", 0.0,
      f"memory estimate {ratio:.2f}x the measured peak",
      f"estimate and measured peak differ by more than {MEMORY_DISAGREEMENT:.0%}",
      [f"estimated {est['total_mb']:.0f} MB (baseline {est['baseline_mb']:.0f}, "
       f"activations {est['activations_mb_per_example'] * est['batch_size']:.0f}, "
       f"parameters, gradients and optimizer "
       f"{est['parameters_mb'] + est['gradients_mb'] + est['optimizer_mb']:.0f}), "
       f"measured peak {peak:.0f} MB"],
      "trust the measured peak: scale the batch by the room it leaves "
      f"({mem.get('available_mb', 0):.0f} MB were available)",
      ["memory"])


def _where_time_goes(ev: Evidence, advice: bool = True) -> str:
  """The next step when time is lost somewhere: the trace's top ops, or a trace; with
  the kernel probe's measured fastest policy in place of general advice."""
  top = (ev.op_stats or {}).get("top_ops") or []
  k = evidence_lib.kernels(ev)
  fastest = (k or {}).get("fastest")
  if top:
    where = "the trace puts the time in " + ", ".join(
        f"{o['type']} ({o['share']:.0%})" for o in top[:2])
    if k and advice and fastest and fastest != ev.summary.get("policy"):
      return (f"{where}; the policy measured fastest for these ops here: "
              f"{evidence_lib.rerun(ev, fastest)}")
    return where + (": speed those up or move them to a dtype/device with a fast "
                    "kernel" if advice and not k else "")
  return ("--profile_steps=A,B, then --mode=diagnose lists the op types that take "
          "the time")


DETECTORS: dict[str, Callable[[Evidence], Finding | None]] = {
    "slow_kernel": slow_kernel, "hardware": hardware, "opportunity": opportunity,
    "loss_scale": loss_scale, "input_bound": input_bound,
    "low_utilisation": low_utilisation, "shared_machine": shared_machine,
    "misaligned": misaligned, "float32_work": float32_work,
    "batchnorm_cost": batchnorm_cost, "no_speedup": slower_than_float32,
    "achieved_rate": achieved_rate, "tf32": tf32, "memory_estimate": memory_estimate,
    "onednn": onednn,
}
NEEDS = {"misaligned": "dtypes.json", "float32_work": "dtypes.json",
         "batchnorm_cost": "dtypes.json"}


def rank(findings: list[Finding]) -> list[Finding]:
  """By severity; a measured loss of HIGH_LOSS or more first; then by impact."""
  return sorted(findings, key=lambda f: (SEVERITY.index(f.severity),
                                         (f.slowdown or 0) < HIGH_LOSS, -f.impact))
