"""Which policy is fast here, from measurement: the kernel table (mpt/machine/kernels.py
on a CPU, mpt/machine/gpu_table.py on a GPU: this model's step profiled per policy)
first, the CPU flags and GPU compute capabilities (mpt/machine/hardware.py) only when
nothing was measured. When the two disagree, the verdict says so in words. On a GPU
the verdict also says when a 16-bit policy's convolutions and matmuls ran on CUDA
cores rather than Tensor Cores, and in which layers.

A policy's measured cost is its time over float32's, summed over the ops a model's
training step runs (forward and backward, the op families of its layers): on the
Sapphire Rapids machine of tests/data/kernels that is ~100x for float16's convolutions
(oneDNN's reference kernel for backward-weights) and ~0.4x for bfloat16's (AMX).
"""

from typing import Any

from mpt import config
from mpt.machine import gpu_table
from mpt.machine import hardware
from mpt.machine import probe_ops
from mpt.records import cost as cost_records
from mpt.records.cost import times
from mpt.records.verdict import PolicyVerdict

SLOW = 2.0  # A policy measured this many times float32's time is warned about.
# The cut-off of every timing before step 1 (the step's, mpt/train/before_step1/cost.py;
# each layer's, mpt/measure/layercost.py): a policy whose ops the kernel table measured
# PATHOLOGICAL times float32's is predicted from the table, not run.
PATHOLOGICAL = 10.0
# Layer classes -> the op families their training step runs.
LAYER_FAMILIES = {"Conv2D": "conv", "Conv1D": "conv", "Conv3D": "conv",
                  "DepthwiseConv2D": "depthwise", "SeparableConv2D": "depthwise",
                  "Dense": "matmul", "EinsumDense": "matmul",
                  "MultiHeadAttention": "matmul", "BatchNormalization": "batchnorm",
                  "FusedBatchNormalization": "batchnorm"}


def families_of(layer_classes) -> list[str]:
  """The op families of a model, from its layers' class names (all if none known)."""
  found = sorted({LAYER_FAMILIES[c] for c in layer_classes if c in LAYER_FAMILIES})
  return found or ["conv", "depthwise", "matmul", "batchnorm"]


def _gpu(table: dict[str, Any] | None) -> bool:
  return bool(table) and table.get("kind") == "gpu"


def _rows(table: dict[str, Any], families) -> list[dict[str, Any]]:
  if _gpu(table):  # Rows by GPU op family: a depthwise convolution's kernels are conv.
    gpu_families = {"depthwise": "conv"}
    return [r for r in table.get("rows", [])
            if r["op"] in {gpu_families.get(f, f) for f in families}]
  ops = {op for f in families for op in probe_ops.FAMILIES[f]}
  return [r for r in table.get("rows", []) if r["op"] in ops]


def policy_ratios(table: dict[str, Any] | None, families) -> dict[str, float]:
  """Each policy's summed op time over float32's, for the ops all dtypes measured."""
  if not table:
    return {}
  rows = _rows(table, families)
  by = {(r["op"], r["dtype"]): r.get("ms") for r in rows}
  ops = [op for op in {r["op"] for r in rows}
         if all(by.get((op, d)) for d in config.POLICY_DTYPE.values())]
  base = sum(by[op, "float32"] for op in ops)
  if not ops or not base:
    return {}
  return {p: sum(by[op, d] for op in ops) / base for p, d in config.POLICY_DTYPE.items()}


def pathological(table: dict[str, Any] | None, families) -> dict[str, float]:
  """{policy: its ops' time over float32's} for the 16-bit policies whose ops of
  these families the kernel table measured PATHOLOGICAL times float32's (oneDNN's
  reference float16 convolution on a Sapphire Rapids: ~100x, 13-17 s a step for the
  seed convnet): predicted from the table, not run."""
  ratios = policy_ratios(table, families) if table and families else {}
  return {p: r for p, r in ratios.items() if p != "float32" and r >= PATHOLOGICAL}


def worst_op(table: dict[str, Any], dtype: str, families) -> dict[str, Any] | None:
  """The op whose `dtype` kernel is slowest relative to float32's."""
  rows = [r for r in _rows(table, families) if r["dtype"] == dtype and r.get("ratio")]
  return max(rows, key=lambda r: r["ratio"]) if rows else None


def _warning(policy: str, found: PolicyVerdict, step_ms, worst, dtype: str) -> str:
  """The one-line warning on a policy measured slow."""
  ratio, ratios, fastest = found.ratio, found.policy_ratios, found.fastest
  if found.evidence == "cost":
    text = (f"{policy}: this model's step measured {times(ratio)} float32's time here "
            f"(~{step_ms[policy]:,.0f} vs ~{step_ms['float32']:,.0f} ms/step)")
  else:  # The table's representative shapes, not this model's: a guess.
    text = (f"{policy}: the kernel table's representative shapes measured "
            f"{times(ratio)} float32's time here (a guess about this model: its step "
            "was not timed)")
  if worst:
    kernel = worst["impl"] + (" (oneDNN's reference kernel)" if worst["reference"]
                              else "")
    text += (f"; worst: {dtype} {worst['op']} runs {kernel}, "
             f"{times(worst.get('ratio') or 0)} float32")
  if fastest != policy:
    text += (f"; measured fastest here: --policy={fastest} "
             f"({times(ratios[fastest])} float32's time)")
  return text


def _bounded(policy: str, bound: tuple[str, float], ratios: dict[str, float]
             ) -> PolicyVerdict:
  """The verdict on a policy whose step's timing stopped before it settled: what the
  bound decides (slow only if at least SLOW; faster than float32 only if at most
  below 1), said as a bound; the other policies' figures as measured."""
  kind, ratio = bound
  slow = kind == cost_records.AT_LEAST and ratio >= SLOW
  points = {p: r for p, r in ratios.items() if p != policy}
  faster = kind == cost_records.AT_MOST and ratio < min(points.values())
  fastest = policy if faster else min(points, key=points.get)
  found = PolicyVerdict("cost", slow, ratio, fastest=fastest,
                        fastest_ratio=ratio if faster else points[fastest],
                        policy_ratios=points, bound=kind)
  said = (f"{policy}: this model's step measured {kind} {times(ratio)} float32's time "
          "here (timing stopped before its calls settled)")
  if slow:
    found.text = said
  else:
    found.note = said + ("" if faster else ": undecided until the run's own steps")
  return found


def verdict(policy: str, table: dict[str, Any] | None, families, flags: set[str],
            gpu_caps: list[tuple[int, int]], cpu_name: str,
            step_ms: dict[str, float] | None = None,
            bound: tuple[str, float] | None = None) -> PolicyVerdict:
  """What is known about `policy`'s speed here, and on what evidence
  (mpt/records/verdict.py).

  `step_ms`: this model's step timed per policy before step 1 (predicted ms/step,
  mpt/train/before_step1/cost.py; `bound`: the policy's own, where its timing stopped
  before it settled: (at most | at least, its ratio)), which outranks the kernel
  table's representative shapes; the table then only names the worst op's kernel.
  Without either (or on a GPU, where the table measures nothing), the flags decide."""
  by_flags = hardware.fast_path(policy, flags, gpu_caps, cpu_name)
  ratios = cost_records.ratios(step_ms) if len(step_ms or {}) > 1 else {}
  if bound and not ratios.get(policy) and ratios:
    return _bounded(policy, bound, ratios)
  evidence = "cost" if ratios.get(policy) else "probe"
  if evidence == "probe":  # A CPU's table measures nothing a GPU runs.
    ratios = policy_ratios(table, families) if not gpu_caps or _gpu(table) else {}
  if not ratios:  # Nothing measured: the CPU flags / compute capability speak.
    return PolicyVerdict(
        "flags", slow=bool(by_flags), fastest=by_flags[1] if by_flags else None,
        text=f"{policy}: {by_flags[0]}; use --policy={by_flags[1]}" if by_flags else None)
  dtype, ratio = config.POLICY_DTYPE[policy], ratios[policy]
  fastest = min(ratios, key=ratios.get)
  worst = worst_op(table, dtype, families) if dtype != "float32" and table else None
  slow = ratio >= SLOW
  contradicts = None
  if slow and not by_flags and dtype != "float32":
    contradicts = (f"the CPU flags of {cpu_name} promise a fast {dtype} path, but "
                   f"TensorFlow's kernels measured {times(ratio)} float32's time")
  elif not slow and by_flags:
    contradicts = (f"the CPU flags say {dtype} is emulated on {cpu_name}, but its "
                   f"kernels measured {times(ratio)} float32's time")
  found = PolicyVerdict(
      evidence, slow, ratio,
      worst["op"] if worst else None, worst["impl"] if worst else None,
      worst["ratio"] if worst else None, bool(worst and worst["reference"]), fastest,
      ratios[fastest], contradicts, ratios)
  if slow:
    found.text = _warning(policy, found, step_ms, worst, dtype)
  if _gpu(table) and dtype != "float32":
    _tensor_cores(found, policy, gpu_table.missed(table, dtype))
  return found


def _tensor_cores(found: PolicyVerdict, policy: str,
                  missed: tuple[float, list[str]] | None) -> None:
  """A 16-bit policy whose eligible kernels ran on CUDA cores: share, layers, a line."""
  if missed is None:
    return
  found.cuda_cores_share, found.cuda_cores_layers = round(missed[0], 4), missed[1]
  if missed[0] < gpu_table.MISSED:
    return
  where = f" ({', '.join(missed[1])})" if missed[1] else ""
  line = (f"{missed[0]:.0%} of its convolution and matmul kernel time ran on CUDA "
          f"cores, not Tensor Cores{where}: channels, units and the batch in multiples "
          f"of 8 (the first convolution's 3 input channels padded) keep them there")
  found.text = f"{found.text}; {line}" if found.text else f"{policy}: {line}"
