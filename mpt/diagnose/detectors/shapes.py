"""Detectors that read the model's layers (dtypes.json: per-layer dtypes, dims and
FLOPs) beside the trace: shapes the 16-bit units cannot use well, work left in
float32 under a 16-bit policy, and Keras' BatchNormalization layers' share of a step.
"""

from mpt.diagnose.detectors.registry import detector
from mpt.diagnose.evidence import Evidence
from mpt.diagnose.findings import Finding
from mpt.diagnose.thresholds import (BATCHNORM_TIME_SHARE, FLOAT32_FLOP_SHARE,
                                     FLOAT32_TIME_SHARE, MISALIGNED_SHARE)
from mpt.records.cost import times


def _misaligned_step(ev: Evidence, shapes: bool, per_replica: int) -> str:
  s = ev.summary
  aligned = f"{s.model}_aligned"
  if shapes and aligned in ev.model_names:
    return f"--model={aligned} (pads the input channels to 8)"
  if shapes:
    return ("pad the misaligned layers' channels/units to multiples of 8 (as "
            "PadChannels in mpt/models/convnets.py does)")
  return f"--batch_size={(per_replica // 8 + 1) * 8 * (s.replicas or 1)}"


@detector("misaligned", needs="dtypes.json")
def misaligned(ev: Evidence) -> Finding | None:
  s, d = ev.summary, ev.dtypes
  if not s.sixteen or not d:
    return None
  names = d.get("misaligned_layers", [])
  share = d.get("misaligned_flops_share", 0.0)
  layer_time = (ev.op_stats or {}).get("layer_time_share", {})
  time_share = sum(layer_time.get(n, 0.0) for n in names)
  per_replica = s.per_replica_batch or s.batch_size or 0
  shapes = max(share, time_share) >= MISALIGNED_SHARE
  if not shapes and per_replica % 8 == 0:
    return None
  evidence = [f"{l['name']} ({l['class']}, {l['dims']}): {l['flops_share']:.1%} of "
              f"{ev.flops_of}" + (f", {l['time_share']:.1%} of traced op time"
                                  if l["time_share"] is not None else "")
              for l in ev.layer_shares(names)]
  evidence.append(f"{share:.1%} of {ev.flops_of}" + (
      f" and {time_share:.1%} of traced op time" if layer_time else "")
      + " in layers whose channels/units are not multiples of 8")
  if per_replica % 8:
    evidence.append(f"batch size {per_replica} per replica is not a multiple of 8")
  return Finding("misaligned", "medium", max(share, time_share),
                 "misaligned shapes for 16-bit units",
                 f"misaligned share of {ev.flops_of} or of traced op time >= "
                 f"{MISALIGNED_SHARE:.0%}, or a batch not a multiple of 8", evidence,
                 _misaligned_step(ev, shapes, per_replica),
                 ["dtypes"] + (["trace"] if layer_time else []))


@detector("float32_work", needs="dtypes.json")
def float32_work(ev: Evidence) -> Finding | None:
  s, d, ops = ev.summary, ev.dtypes, ev.op_stats or {}
  if not s.sixteen or not d:
    return None
  flop_share = d.get("flops_share_32bit", 0.0)
  time_share = ops.get("float32_time_share", 0.0) + ops.get("cast_time_share", 0.0)
  if flop_share < FLOAT32_FLOP_SHARE and time_share < FLOAT32_TIME_SHARE:
    return None
  layers = sorted(d.get("float32_layers", []), key=lambda l: -l["flops_share"])
  evidence = [f"{flop_share:.1%} of {ev.flops_of} run in float32: " + ", ".join(
      f"{l['name']} {l['flops_share']:.1%}" for l in layers[:5])]
  if ops:
    evidence.append(f"traced op time: {ops.get('float32_time_share', 0):.1%} in "
                    f"float32 layers, {ops.get('cast_time_share', 0):.1%} in Cast ops")
  step = ("BatchNorm normalises in float32 on purpose; --batchnorm=fused does it in "
          "TF's fused kernel, which reads and writes the 16-bit dtype (no casts)"
          if any("BatchNormalization" in l["reason"] for l in layers) else
          "keep only the output layer in float32; drop other forced-float32 dtypes")
  return Finding("float32_work", "medium", max(flop_share, time_share),
                 "32-bit work left under a 16-bit policy",
                 f"float32 FLOP share >= {FLOAT32_FLOP_SHARE:.0%} or traced float32 + "
                 f"cast time >= {FLOAT32_TIME_SHARE:.0%}", evidence, step,
                 ["dtypes"] + (["trace"] if ops else []))


@detector("batchnorm_cost", needs="dtypes.json")
def batchnorm_cost(ev: Evidence) -> Finding | None:
  """Keras' BatchNormalization is separate float32 ops and casts: on a CPU with fast
  16-bit kernels it can be half of a step, which TF's fused kernel mostly removes."""
  s, d, ops = ev.summary, ev.dtypes or {}, ev.op_stats or {}
  shares = ops.get("layer_time_share") or {}
  bn = [l["name"] for l in d.get("layers", []) if l["class"] == "BatchNormalization"]
  share = sum(shares.get(name, 0.0) for name in bn)
  if s.batchnorm != "keras" or share < BATCHNORM_TIME_SHARE:
    return None
  evidence = [f"{share:.1%} of traced op time is in the {len(bn)} BatchNormalization "
              f"layer(s): " + ", ".join(f"{n} {shares.get(n, 0):.1%}" for n in bn[:6])]
  based = ["trace", "dtypes"]
  other = ev.other_batchnorm
  if other and other.batchnorm == "fused" and s.ms_per_step:
    evidence.append(f"the same run with --batchnorm=fused next to it: "
                    f"{other.ms_per_step:.1f} ms/step vs {s.ms_per_step:.1f} "
                    f"({times(s.ms_per_step / other.ms_per_step)} faster) in "
                    f"{other.run_dir}")
    based.append("sibling runs")
  command = (f"python -m mpt.main --flagfile={ev.run_dir}/flags.txt --batchnorm=fused"
             if ev.run_dir else "--batchnorm=fused")
  return Finding("batchnorm_cost", "medium", share,
                 f"BatchNormalization takes {share:.0%} of the traced step",
                 f"traced op time in Keras' BatchNormalization layers >= "
                 f"{BATCHNORM_TIME_SHARE:.0%}", evidence,
                 f"{command} (TF's fused kernel: same variables and math, one op "
                 f"forward and one backward)", based)
