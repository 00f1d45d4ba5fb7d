"""ONEDNN_VERBOSE output: which oneDNN kernels TensorFlow really ran.

With `ONEDNN_VERBOSE=1` oneDNN prints its ISA once and one line per executed
primitive. The line's layout changed across oneDNN versions, so fields are found by
what they look like, not by a fixed position:

  v3 (TF 2.21): onednn_verbose,v1,primitive,exec,cpu,convolution,ref:any,
                backward_weights,src:f16::blocked:acdb::f0 wei:f16:a:... ,,alg:...,PROBLEM,696.265
  v2 / older:   onednn_verbose,exec,cpu,convolution,jit:avx512_core,forward_training,
                src_f32::blocked:aBcd16b:f0 dst_f32::...,,alg:...,PROBLEM,0.12
  TF's sgemm:   onednn_verbose,v1,primitive,exec,cpu,gemm_api,,undef,src_f32::blocked:ab:f0 ...

A line that cannot be read becomes a `Primitive` with kind "unknown" (never an
exception): the kernel table then says "unknown" for that op.
"""

import dataclasses
import re

# oneDNN's short dtype names in memory descriptors.
DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "s8": "int8",
          "u8": "uint8", "s32": "int32", "f64": "float64", "undef": None}
PROPS = ("forward_training", "forward_inference", "backward_data", "backward_weights",
         "backward", "undef", "forward")
# Primitives that only move data between layouts; never the op's own kernel.
LAYOUT_ONLY = ("reorder",)
_SRC = re.compile(r"(?:^|\s)src[_:]([a-z0-9]+?):")
_ISA = re.compile(r"onednn_verbose,(?:v\d+,)?info,cpu,isa:(.*)")


@dataclasses.dataclass
class Primitive:
  """One executed oneDNN primitive."""
  kind: str  # convolution, matmul, inner_product, batch_normalization, gemm_api, ...
  impl: str  # e.g. brg_conv_fwd:avx512_core, ref:any; "" when oneDNN gives none
  prop: str  # forward_training, backward_data, backward_weights, ...
  src_dtype: str | None  # float32, bfloat16, float16, ...; None when not given
  ms: float | None  # its execution time, as oneDNN measured it

  @property
  def reference(self) -> bool:
    """oneDNN's reference implementation: correct everywhere, fast nowhere."""
    return self.impl.startswith("ref")

  @property
  def label(self) -> str:
    what = f"{self.kind}:{self.impl}" if self.impl else self.kind
    return what + (f" on {self.src_dtype}" if self.src_dtype else "")


def parse_line(line: str) -> Primitive | None:
  """The primitive of one `...,exec,...` line; None for any other line."""
  if not line.startswith("onednn_verbose") or ",exec," not in line:
    return None
  parts = line.strip().split(",")
  try:
    at = parts.index("exec") + 1
    if parts[at] in ("cpu", "gpu"):
      at += 1
    kind, impl = parts[at], parts[at + 1]
    prop = parts[at + 2] if parts[at + 2] in PROPS else "undef"
    mds = next((p for p in parts[at + 2:] if _SRC.search(p)), "")
    src = _SRC.search(mds)
    try:
      ms = float(parts[-1])
    except ValueError:
      ms = None
    return Primitive(kind, impl, prop, DTYPES.get(src.group(1), src.group(1))
                     if src else None, ms)
  except (IndexError, ValueError):
    return Primitive("unknown", "", "undef", None, None)


def parse(text: str) -> list[Primitive]:
  """Every executed primitive in `text`, in order."""
  return [p for p in map(parse_line, text.splitlines()) if p is not None]


def isa(text: str) -> str | None:
  """The ISA oneDNN says it dispatches for (its start-up info line)."""
  found = _ISA.search(text)
  return found.group(1).strip() if found else None


def main_kernel(primitives: list[Primitive]) -> Primitive | None:
  """The primitive that did an op's work: the slowest that is not a layout reorder
  (for TF's emulated 16-bit math, a float32 sgemm: its `src_dtype` says so)."""
  work = [p for p in primitives if p.kind not in LAYOUT_ONLY]
  if not work:
    return None
  return max(work, key=lambda p: p.ms or 0.0)
