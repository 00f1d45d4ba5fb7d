"""FLOPs of a step as TensorFlow runs it: counted from the ops of the step's traced
graph, forward and backward, instead of from a table of Keras layer classes.

A step is a `tf.function` (the command line's, Keras' `train_step`, a script's own);
its concrete graph holds every op the step runs: each MatMul, BatchMatMul, Einsum and
convolution and their gradients, a custom layer's own ops, every model the step
calls, a gradient taken to the inputs only. An op counts only where its output is
used: as TensorFlow's function runtime does, the ops outside the fan-in of the step's
outputs and of its stateful ops (a gradient nothing reads: the first convolution's
input gradient) are pruned before they run, and so are not counted here.

Per op: TensorFlow's own FLOP statistics (`RegisterStatistics(op, "flops")`: MatMul,
Conv2D and its two gradients, Conv3D, DepthwiseConv2dNative, the elementwise
arithmetic) where it registers one; this module's formula for the matmul-class ops it
does not register (Einsum, the depthwise and 3-D convolution gradients) and for
BatchMatMul, whose registered statistic ignores a transposed operand; for a
function call, a branch (If: the larger branch) or a loop whose trip count the graph
fixes, the ops inside. Any other op's FLOPs are unknown and counted as such
(`uncounted`), never guessed: a While loop of unknown length, an op with a shape only
known at run time. Ops nobody registers FLOPs for (Relu, casts, reshapes) are not
counted, as TensorFlow's profiler does not count them.

Each op's FLOPs are kept by the layer path of its name scope and by the dtype it
computes in; `into_report` gives them to the run's dtypes report (per layer row, and
the shares of 16-bit and float32 work).

A multiply-add counts as 2 FLOPs, as everywhere in mpt.
"""

import contextlib
import dataclasses
import math
import re

import tensorflow as tf

from mpt import files
from mpt.measure import dtypes as dtypes_lib
from mpt.models import fused_bn
from mpt.train.common import keras_fit

HOW = ("graph: the ops of the traced step, forward and backward, as TensorFlow runs "
       "them (TensorFlow's registered op statistics; mpt's formula for Einsum, "
       "BatchMatMul and the convolution gradients)")
# The ops whose FLOPs make a step's arithmetic: the ones a peak rate is about.
MATMUL_OPS = {"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum",
              "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D",
              "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2", "DepthwiseConv2dNative",
              "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter"}
CALLS = {"PartitionedCall", "StatefulPartitionedCall"}
BRANCHES = {"If", "StatelessIf"}
LOOPS = {"While", "StatelessWhile"}
_GRADIENT_SCOPE = "gradient_tape/"


@dataclasses.dataclass
class StepFlops:
  """One step's FLOPs at the batch it was traced with."""
  total: int = 0
  matmul: int = 0  # Of which MatMul/BatchMatMul/Einsum/convolutions, both passes.
  by_scope: dict[str, int] = dataclasses.field(default_factory=dict)  # Layer path.
  uncounted: dict[str, int] = dataclasses.field(default_factory=dict)  # Op type: n.
  by_dtype: dict[str, int] = dataclasses.field(default_factory=dict)  # The op's dtype.
  float32_by_scope: dict[str, int] = dataclasses.field(default_factory=dict)
  how: str = HOW

  def add(self, other: "StepFlops") -> None:
    self.total += other.total
    self.matmul += other.matmul
    for field in ("by_scope", "uncounted", "by_dtype", "float32_by_scope"):
      for key, n in getattr(other, field).items():
        _bump(getattr(self, field), key, n)

  def rename(self, path) -> None:
    """Scopes renamed by `path` (a scope -> the layer path it stands for)."""
    for field in ("by_scope", "float32_by_scope"):
      renamed: dict[str, int] = {}
      for scope, n in getattr(self, field).items():
        _bump(renamed, path(scope), n)
      setattr(self, field, renamed)

  def unknown(self, kind: str) -> None:
    """One op of type `kind` whose FLOPs the graph does not fix."""
    _bump(self.uncounted, kind, 1)


def _bump(counts: dict[str, int], key: str, n: int) -> None:
  counts[key] = counts.get(key, 0) + n


def of_step(step, *args, **kwargs) -> StepFlops:
  """The FLOPs of `step(*args, **kwargs)`: a tf.function's concrete function for these
  arguments (traced already where the step ran with them: no second trace), or a
  Python function traced once for counting (nothing runs)."""
  fn = step if hasattr(step, "get_concrete_function") else tf.function(step)
  return count(fn.get_concrete_function(*args, **kwargs).graph)


def of_trace(step, args: tuple, models: list) -> StepFlops:
  """The FLOPs of a step not yet traced (a tf.function made for counting), traced
  here with the name scope each layer of `models` runs under recorded: TensorFlow
  makes a scope unique with a suffix (`conv2d` may run under `conv2d_1`, and the layer
  `conv2d_1` under `conv2d_1_2`), which no name rule can undo. Each op's scope is then
  the path of its layers' own names."""
  with layer_scopes(models) as scopes:
    graph = step.get_concrete_function(*args).graph
  return count(graph, scopes)


@contextlib.contextmanager
def layer_scopes(models: list):
  """{name scope: layer name}, filled while the step traces: each layer's `call` is
  wrapped, on the instance and for the trace only, to read the scope Keras opened."""
  scopes: dict[str, str] = {}
  layers = [m for m in models] + [l for m in models for l in fused_bn.all_layers(m)]
  patched = []
  for layer in {id(l): l for l in layers}.values():
    if "call" in vars(layer):  # A call set on the instance already: left as it is.
      continue
    def call(*args, _original=layer.call, _name=layer.name, **kwargs):
      scopes.setdefault(tf.get_current_name_scope(), _name)
      return _original(*args, **kwargs)
    object.__setattr__(layer, "call", call)
    patched.append(layer)
  try:
    yield scopes
  finally:
    for layer in patched:
      object.__delattr__(layer, "call")


def named(scope: str, scopes: dict[str, str]) -> str:
  """`scope` with each part that is a recorded layer's scope read as that layer's
  name (`residual_unet_1/conv2d_1_2` -> `residual_unet/conv2d_1`)."""
  parts = scope.split("/")
  return "/".join(scopes.get("/".join(parts[:i + 1]), part)
                  for i, part in enumerate(parts))


def count(graph, scopes: dict[str, str] | None = None) -> StepFlops:
  """The FLOPs of the ops of `graph` (a FuncGraph) that run; with `scopes` (recorded
  as it traced: layer_scopes), each op's scope read as its layers' path."""
  found = StepFlops()
  for op in _running(graph):
    _count_op(graph, op, found)
  if scopes is not None:
    found.rename(lambda scope: named(scope, scopes))
  return found


def _running(graph) -> list:
  """The ops in the fan-in of the graph's outputs and stateful ops (what runs)."""
  roots = [t.op for t in getattr(graph, "outputs", []) if t is not None]
  roots += list(getattr(graph, "control_outputs", []))
  roots += [op for op in graph.get_operations() if op.op_def.is_stateful and
            op.type not in ("Placeholder", "VarHandleOp")]
  seen, stack = set(), list(roots)
  while stack:
    op = stack.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  return [op for op in graph.get_operations() if op.name in seen]


def _count_op(graph, op, found: StepFlops) -> None:
  if op.type in CALLS | BRANCHES | LOOPS:
    names = {"f"} if op.type in CALLS else {"body"} if op.type in LOOPS else \
        {"then_branch", "else_branch"}
    inner = [_function(graph, op.get_attr(a).name) for a in sorted(names)]
    if any(g is None for g in inner):
      found.unknown(op.type)
      return
    counted = [count(g) for g in inner]
    if op.type in LOOPS:  # Its trip count is not in the graph: known only if empty.
      if counted[0].total:
        found.unknown(op.type)
      return
    found.add(max(counted, key=lambda f: f.total))  # A call, or the larger branch.
    return
  flops = _flops(graph, op)
  if flops is None and op.type in MATMUL_OPS:
    found.unknown(op.type)
  if not flops:
    return
  found.total += flops
  found.matmul += flops if op.type in MATMUL_OPS else 0
  scope, dtype = scope_of(op.name), _dtype(op)
  _bump(found.by_scope, scope, flops)
  _bump(found.by_dtype, dtype, flops)
  if dtype == "float32":
    _bump(found.float32_by_scope, scope, flops)


def _dtype(op) -> str:
  """The dtype an op computes in: its type attribute `T` (a MatMul's, a Conv2D's),
  else its first output's."""
  try:
    return tf.as_dtype(op.get_attr("T")).name
  except (ValueError, TypeError):
    return op.outputs[0].dtype.name if op.outputs else "unknown"


def scope_of(name: str) -> str:
  """The layer path an op belongs to: its name scope without the gradient's prefix
  and without the op's own trailing names (`gradient_tape/model/conv1/convolution/
  Conv2DBackpropFilter` -> `model/conv1`)."""
  parts = name.removeprefix(_GRADIENT_SCOPE).split("/")[:-1]
  # The op's own sub-scopes (`convolution`, `MatMul`, `einsum`) after the layer's.
  while parts and parts[-1] in _OP_SCOPES:
    parts.pop()
  return "/".join(parts)


_OP_SCOPES = {"convolution", "MatMul", "einsum", "Einsum", "BiasAdd", "depthwise",
              "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Relu", "Softmax", "Mul",
              "AddV2", "Add", "add", "mul", "truediv", "sub", "Sum", "Mean"}


_function = keras_fit.function_graph


def _flops(graph, op) -> int | None:
  """FLOPs of one op; None: unknown (no statistic and a matmul-class op, or a shape
  only known at run time); 0: no arithmetic counted."""
  own = _OWN.get(op.type)
  try:
    value = own(op) if own else keras_fit.registered_flops(graph, op)
  except (ValueError, TypeError):
    return None  # A formula or statistic that needs a shape the graph does not fix.
  return 0 if value is None and op.type not in MATMUL_OPS else value


def _shape(tensor) -> list[int]:
  dims = tensor.shape.as_list() if tensor.shape.rank is not None else None
  if dims is None or any(d is None for d in dims):
    raise ValueError(f"{tensor.name}: shape not fixed in the graph")
  return dims


def _einsum(op) -> int:
  """2 x the product of every index's extent (each output element sums over the
  contracted indices): the equation and the operands' shapes."""
  equation = op.get_attr("equation").decode()
  inputs, _ = equation.replace(" ", "").split("->")
  extent = {}
  for spec, tensor in zip(inputs.split(","), op.inputs):
    dims = _shape(tensor)
    if "." in spec:
      raise ValueError("ellipsis einsum")
    for letter, size in zip(spec, dims):
      extent[letter] = max(extent.get(letter, 1), size)
  return 2 * math.prod(extent.values())


def _conv_backprop(op) -> int:
  """A convolution's gradient costs what its forward op costs: 2 x the output's
  elements x the filter's work per output, read from the forward shapes the
  gradient op is given (input sizes or filter sizes, and the out_backprop)."""
  out = _shape(op.inputs[2])  # out_backprop: the forward op's output.
  if op.type.endswith("BackpropInput") or op.type.endswith("BackpropInputV2"):
    filt = _shape(op.inputs[1])
  else:
    filt = tf.get_static_value(op.inputs[1])
    if filt is None:
      raise ValueError("filter sizes not constant")
    filt = [int(d) for d in filt]
  if op.type.startswith("DepthwiseConv2dNative"):
    # filter [h, w, in, multiplier]; each output element is one input channel's window.
    return 2 * math.prod(out) * filt[0] * filt[1]
  *window, c_in, _ = filt
  return 2 * math.prod(out) * math.prod(window) * c_in


def _batch_matmul(op) -> int:
  """2 x the contracted extent x the output's elements. TensorFlow's statistic for
  BatchMatMul (TF 2.21) takes the contracted extent from x's last dimension even
  where adj_x transposes it (a weight's gradient: [b, t, in]^T x [b, t, out]), which
  counts such a product by in/t too much or too little."""
  x = _shape(op.inputs[0])
  k = x[-2] if op.get_attr("adj_x") else x[-1]
  return 2 * k * math.prod(_shape(op.outputs[0]))


_OWN = {"Einsum": _einsum, "BatchMatMul": _batch_matmul, "BatchMatMulV2": _batch_matmul,
        "BatchMatMulV3": _batch_matmul,
        "Conv3DBackpropInputV2": _conv_backprop, "Conv3DBackpropFilterV2": _conv_backprop,
        "DepthwiseConv2dNativeBackpropInput": _conv_backprop,
        "DepthwiseConv2dNativeBackpropFilter": _conv_backprop}


def by_row(scopes: dict[str, int], rows: list[str],
           aliases: dict[str, str] | None = None) -> dict[str, int]:
  """`by_scope` summed per layer row of a dtypes report (`rows`: their paths, which
  leave out the model and any nested model that holds every layer): a scope is its
  deepest part that ends in a row's path (`gemma_causal_lm_1/gemma_backbone_1/
  decoder_block_0_1/attention_1/query_1/einsum` -> `decoder_block_0/attention/query`),
  the `_1` a second trace gives a scope dropped, and a segment renamed by `aliases`
  (a part's Keras name -> its name in the rows). Scopes of no row (a layer's own ops
  beside its sublayers', the loss, the optimizer) are left out."""
  segments = {seg for row in rows for seg in row.split("/")}
  known, aliases = set(rows), aliases or {}
  plain = lambda p: p if p in segments else re.sub(r"_\d+$", "", p)
  out: dict[str, int] = {}
  for scope, n in scopes.items():
    parts = [aliases.get(plain(p), plain(p)) for p in scope.split("/")]
    found = next((path for end in range(len(parts), 0, -1) for start in range(end)
                  if (path := "/".join(parts[start:end])) in known), None)
    if found:
      _bump(out, found, n)
  return out


def _part_aliases(report: dict) -> dict[str, str]:
  """A report of parts: each part's Keras name -> the part's name in the rows. Parts
  sharing a Keras name (an EMA copy by clone_model) cannot be told apart by the name
  scopes of the step's ops: theirs go to the first such part, the one listed first
  (the trained network before its copy, as the parts are found)."""
  aliases: dict[str, str] = {}
  for part, keras_name in zip(report.get("parts", []), report.get("part_models", [])):
    aliases.setdefault(keras_name, part)
  return aliases


def into_report(report: dict, found: StepFlops, batch_size: int | None) -> None:
  """`found` written into a dtypes report (measure/dtypes.with_step): the step's
  figures as `step_flops`, each layer row's FLOPs and the shares by the dtype each op
  computes in."""
  rows = [row["name"] for row in report["layers"]]
  step = {"batch_size": batch_size, "total": None if found.uncounted else found.total,
          "matmul": found.matmul, "uncounted": found.uncounted, "counted_by": found.how}
  aliases = _part_aliases(report)
  dtypes_lib.with_step(report, step, by_row(found.by_scope, rows, aliases),
                       found.by_dtype, by_row(found.float32_by_scope, rows, aliases))


def into_files(report: dict | None, found: StepFlops, batch_size: int | None,
               folder, writer) -> None:
  """`found` into the run's dtype report (`into_report`), then its dtypes.json in
  `folder` and its TensorBoard table (`writer`): both entries' once-counted FLOPs."""
  if not report:
    return
  into_report(report, found, batch_size)
  files.write_json(folder / "dtypes.json", report)
  writer.text("inspect/dtypes", dtypes_lib.format_table(report, markdown=True))
