"""Op statistics from a run's profiler trace, for the diagnosis: where step time went.

A run made with `--profile_steps=A,B` holds `plugins/profile/<time>/*.xplane.pb`. The
profile plugin's own converter (xprof, `framework_op_stats`: the "TensorFlow stats"
page of the profile plugin) turns it into a table of ops with their self time; this
module condenses that table into `op_stats.json` in the run folder: time share per op
type, per layer (op names carry the layer's name scope) and the shares spent in Cast
ops and in the layers dtypes.json lists as float32. The device's rows are used when the
trace has any (GPU), else the host's (CPU); idle time is left out.

Op types are grouped under their canonical TensorFlow names (`canonical_type`): which
kernel name a trace shows depends on the CPU TensorFlow runs on. With its oneDNN graph
rewrite on (the default on CPUs with AVX512_VNNI, AVX512_BF16 or AMX), `Conv2D` runs as
`_MklNativeConv2D` or `_MklNativeFusedConv2D` and its filter gradient as
`_MklNativeConv2DBackpropFilterWithBias`; elsewhere they are `Conv2D`, `_FusedConv2D`
and `Conv2DBackpropFilter`. The kernel names seen are kept beside each type.
"""

import collections
import json
import pathlib
import re
from typing import Any

from mpt.machine import traces


def find_trace(run_dir: pathlib.Path) -> pathlib.Path | None:
  """The newest trace in the run folder, or None."""
  found = sorted(run_dir.glob("plugins/profile/*/*.xplane.pb"))
  return found[-1] if found else None


def framework_op_stats(trace: pathlib.Path) -> list[dict[str, Any]]:
  """The profile plugin's op table for `trace`: one dict per (op, host or device)."""
  data, _ = traces.tool_data(trace, "framework_op_stats", quiet=True)
  if not data:
    raise ValueError(f"xprof could not convert {trace}")
  table = json.loads(data)[0]
  cols = [c["id"] for c in table["cols"]]
  return [dict(zip(cols, (c.get("v") for c in row["c"]))) for row in table["rows"]]


_MKL = re.compile(r"^_Mkl(?:Native)?")
# Grappler's fusions of an op with its bias/activation that keep the op's role, and
# their canonical name: `_FusedConv2D` is still the forward convolution.
_FUSED = re.compile(r"^_?Fused(?=Conv2D|MatMul|BatchMatMul|DepthwiseConv2dNative|Conv3D)")
_SUFFIX = re.compile(r"WithBias$")
# Kernels named after something other than the op they stand for.
_RENAMED = {"FusedBatchNormEx": "FusedBatchNormV3",
            "Conv2DWithBiasBackpropBias": "BiasAddGrad"}


def canonical_type(op_type: str) -> str:
  """The TensorFlow op an op type (as a trace on any CPU names it) stands for."""
  name = _MKL.sub("", op_type)
  name = _RENAMED.get(name.lstrip("_"), name)
  name = _SUFFIX.sub("", _FUSED.sub("", name))
  return name or op_type


def _layer_of(op_name: str, layers: set[str]) -> str | None:
  """The model layer an op belongs to, from its name scope (`model_1/conv1_1/...`)."""
  for part in op_name.split("/"):
    if part in layers:
      return part
    base = re.sub(r"_\d+$", "", part)  # Keras adds `_1` to a scope entered again.
    if base in layers:
      return base
  return None


def condense(rows: list[dict[str, Any]], dtypes: dict[str, Any] | None,
             trace: str = "") -> dict[str, Any]:
  """Shares of op self time by type and layer, Cast time and float32-layer time."""
  where = "Device" if any(r["host_or_device"] == "Device" for r in rows) else "Host"
  ops = [r for r in rows if r["host_or_device"] == where and r["type"] != "IDLE"]
  total = sum(r["total_self_time"] for r in ops) or 1.0
  by_type, by_layer = collections.Counter(), collections.Counter()
  kernels = collections.defaultdict(set)
  layers = {l["name"] for l in (dtypes or {}).get("layers", [])}
  f32_layers = {l["name"] for l in (dtypes or {}).get("float32_layers", [])}
  for r in ops:
    kind = canonical_type(r["type"])
    by_type[kind] += r["total_self_time"]
    kernels[kind].add(r["type"])
    if layer := _layer_of(r["operation"], layers):
      by_layer[layer] += r["total_self_time"]
  cast = by_type.get("Cast", 0.0)
  return {
      "trace": trace, "rows": where, "op_time_ms": total / 1e3,
      "top_ops": [{"type": t, "share": us / total, "ms": us / 1e3,
                   "kernels": sorted(kernels[t])}
                  for t, us in by_type.most_common(10)],
      "layer_time_share": {l: us / total for l, us in by_layer.most_common()},
      "cast_time_share": cast / total,
      "float32_time_share": sum(by_layer[l] for l in f32_layers) / total,
  }


def load(run_dir: pathlib.Path, dtypes: dict[str, Any] | None) -> dict[str, Any] | None:
  """op_stats.json of the run (made from its newest trace if missing or older), or None."""
  out, trace = run_dir / "op_stats.json", find_trace(run_dir)
  if out.exists() and (trace is None or out.stat().st_mtime >= trace.stat().st_mtime):
    return json.loads(out.read_text())
  if trace is None:
    return None
  stats = condense(framework_op_stats(trace), dtypes, str(trace.relative_to(run_dir)))
  out.write_text(json.dumps(stats, indent=2) + "\n")
  return stats
