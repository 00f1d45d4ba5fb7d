"""Per-layer dtype inspection: where the 16-bit and the 32-bit work of a model goes.

One row per layer doing its own work, as one real call of the model shows it (any
model: Functional, Sequential, subclassed, custom layers, nested models;
mpt/measure/observe.py): class, dtype policy, compute and variable dtype, the dtype of the
layer's output *observed in a real forward pass* (not read off the policy), parameter
count, forward FLOPs per example, and whether its matrix dimensions (channels in/out,
units) are multiples of 8, the Tensor Core / AMX alignment rule. Below the rows: the
share of forward FLOPs run in 16-bit and in 32-bit, the layers that run in float32 and
why, and the dtypes of the gradients (they must be the float32 of the variables).
Once the training step is counted from its graph (`with_step`), each row also holds
its FLOPs in the step and the shares are the step's, by the dtype each op runs in.

Used after every training run (dtypes.json, TensorBoard text `inspect/dtypes`) and
without training by `python -m mpt.main --mode=inspect` (mpt/train/cli/run.py).
"""

import math
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from mpt.errors import UserError
from mpt.measure import observe
from mpt.measure import policies
from mpt.models.fused_bn import FusedBatchNormalization

MATMUL_LAYERS = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D,
                 keras.layers.Dense)


def _size(shape) -> int:
  return int(np.prod([d for d in shape[1:]])) if shape else 0


def layer_flops(layer: keras.layers.Layer, in_shape: tuple | None,
                out_shape: tuple | None) -> tuple[int, tuple[int, int] | None]:
  """(forward FLOPs per example, (matrix dim in, dim out) or None) of one layer, from
  the shapes it was seen called with. A multiply-add counts as 2 FLOPs. Convolutions and
  dense layers count their multiply-adds (plus one per output for a fused activation),
  EinsumDense those of its equation; BatchNorm 4 per element (subtract, divide, scale,
  shift); any other layer one per output element."""
  if hasattr(layer, "flops_per_example"):  # A custom layer that counts its own.
    return int(layer.flops_per_example()), None
  out = _size(out_shape)
  if isinstance(layer, keras.layers.DepthwiseConv2D):
    return 2 * out * math.prod(layer.kernel_size), None
  if isinstance(layer, MATMUL_LAYERS) and in_shape and out_shape:
    c_in = in_shape[-1]
    per_output = c_in * (math.prod(layer.kernel_size) // getattr(layer, "groups", 1)
                         if hasattr(layer, "kernel_size") else 1)
    act = out if getattr(layer, "activation", None) not in (
        None, keras.activations.linear) else 0
    return 2 * out * per_output + act, (c_in, out_shape[-1])
  if isinstance(layer, keras.layers.EinsumDense) and _contracted(layer):
    return 2 * out * _contracted(layer), None
  if isinstance(layer, (keras.layers.BatchNormalization, FusedBatchNormalization)):
    return 4 * out, None
  return out, None


def _contracted(layer: keras.layers.EinsumDense) -> int | None:
  """How many products make one output of an EinsumDense: the size of the kernel's
  axes its equation sums over (`btd,dnh->btnh`: d). None where the kernel's
  subscripts hold an ellipsis."""
  inputs, output = layer.equation.split("->")
  kernel = inputs.split(",")[1]
  if "." in kernel or len(kernel) != len(layer.kernel.shape):
    return None
  return math.prod(int(n) for axis, n in zip(kernel, layer.kernel.shape)
                   if axis not in output)


def _counted(layer: keras.layers.Layer) -> bool:
  """Whether `layer_flops` knows the layer's work: Keras' own layers and layers that
  count their own; a custom layer's own ops (a matmul on its weights) cannot be seen."""
  return (type(layer).__module__.startswith(("keras.", "mpt.")) or
          hasattr(layer, "flops_per_example") or not layer.weights)


def _float32_reason(layer: keras.layers.Layer, global_policy: str) -> str | None:
  if layer.compute_dtype == "float32":
    return "float32 policy" if global_policy == "float32" else \
        "dtype forced to float32 (numerically sensitive)"
  if isinstance(layer, (keras.layers.BatchNormalization,
                        keras.layers.LayerNormalization)):
    return f"{type(layer).__name__} normalises in float32 (Keras upcasts 16-bit inputs)"
  return None


def _row(call: observe.Call, global_policy: str, name: str) -> dict[str, Any]:
  """One layer's row (`name`: its unique path), from its call in the forward pass."""
  layer, out = call.layer, call.output
  out_shape = tuple(out.shape) if out is not None else None
  flops, dims = layer_flops(layer, call.input_shape, out_shape)
  return {
      "name": name,
      "class": type(layer).__name__,
      "policy": policies.resolved(layer).name,
      "compute_dtype": layer.compute_dtype,
      "variable_dtype": layer.variable_dtype,
      # None: the layer returned no tensor (a structure of none), nothing to observe.
      "output_dtype": keras.backend.standardize_dtype(out.dtype) if out is not None
                      else None,
      "output_elements": _size(out_shape),  # Per example: memory estimates.
      "params": int(layer.count_params()),
      "flops": int(flops) * call.calls,
      "dims": f"{dims[0]}->{dims[1]}" if dims else "",
      "aligned8": (dims[0] % 8 == 0 and dims[1] % 8 == 0) if dims else None,
      "float32_reason": _float32_reason(layer, global_policy),
  }


def _gradient_dtypes(model: keras.Model, x) -> list[str]:
  """The dtypes of the loss' gradients with respect to the trainable variables (a
  stand-in loss: the mean of every floating output)."""
  # training=False: a training-mode pass would move BatchNorm's statistics before the
  # run starts; the gradients' dtypes are the same either way.
  found: set[str] = set()

  def gradient_dtypes():
    with tf.GradientTape() as tape:
      outs = [o for o in keras.tree.flatten(model(x, training=False))
              if hasattr(o, "dtype") and tf.as_dtype(o.dtype).is_floating]
      loss = tf.add_n([tf.reduce_mean(tf.cast(o, tf.float32)) for o in outs]) \
          if outs else tf.constant(0.0)
    grads = tape.gradient(loss, model.trainable_variables)
    found.update(g.dtype.name for g in grads if g is not None)

  # In a replica context: under a strategy, gradients with respect to mirrored
  # variables exist only there (one device: a plain call).
  if tf.distribute.has_strategy():
    strategy = tf.distribute.get_strategy()
    tf.function(lambda: strategy.run(gradient_dtypes))()  # Eager run: slow, warns.
  else:
    gradient_dtypes()
  return sorted(found)


def _shares(rows: list[dict[str, Any]]) -> dict[str, Any]:
  """The report's totals over the layer rows: FLOPs, and their shares by kind; each
  row's share of them (`flops_share`)."""
  total = sum(r["flops"] for r in rows) or 1
  f32 = sum(r["flops"] for r in rows if r["float32_reason"])
  misaligned = sum(r["flops"] for r in rows if r["aligned8"] is False)
  for r in rows:
    r["flops_share"] = r["flops"] / total
  return {
      "forward_flops_per_example": int(sum(r["flops"] for r in rows)),
      "shares_of": "forward FLOPs",
      "flops_share_16bit": (total - f32) / total,
      "flops_share_32bit": f32 / total,
      "misaligned_flops_share": misaligned / total,
      "misaligned_layers": [r["name"] for r in rows if r["aligned8"] is False],
      "float32_layers": [{"name": r["name"], "reason": r["float32_reason"],
                          "flops_share": r["flops"] / total}
                         for r in rows if r["float32_reason"]],
  }


def with_step(report: dict[str, Any], step: dict[str, Any], by_layer: dict[str, int],
              by_dtype: dict[str, int], float32_by_layer: dict[str, int]) -> None:
  """Adds the training step's FLOPs, counted from the ops of its traced graph
  (mpt/train/common/stepflops.py), to `report`: `step_flops` (the step's figures),
  each row's `step_flops` (its ops', forward and backward; None: no op of the step
  is in its scope) and the shares recomputed over the step's FLOPs (`shares_of`):
  16-bit and 32-bit by the dtype each op computes in; a float32 layer's by its own
  ops, and under a 16-bit policy the layers whose ops compute in float32 although
  their policy is 16-bit (a float32 logits projection) listed with them. The forward
  table cannot see a layer's own ops (attention's matmuls, a custom layer's), so
  where the step was counted its shares are the ones reported."""
  report["step_flops"] = step
  for row in report["layers"]:
    row["step_flops"] = by_layer.get(row["name"])
  if any(row["step_flops"] for row in report["layers"]):  # A part the step never
    report["forward_flops_per_example"] = sum(  # runs (an EMA copy) is not its work.
        row["flops"] for row in report["layers"] if row["step_flops"])
  total = sum(n for dtype, n in by_dtype.items() if dtype.startswith(("float", "bfloat")))
  if not total:
    return
  for row in report["layers"]:
    row["flops_share"] = (row["step_flops"] or 0) / total
  listed = {layer["name"] for layer in report["float32_layers"]}
  inside = [] if report["policy"] == "float32" else [
      {"name": row["name"], "reason": "its ops compute in float32 under a 16-bit policy"}
      for row in report["layers"]
      if row["name"] not in listed and float32_by_layer.get(row["name"])]
  report["float32_layers"] += inside
  for layer in report["float32_layers"]:
    layer["flops_share"] = float32_by_layer.get(layer["name"], 0) / total
  report["float32_layers"].sort(key=lambda layer: -layer["flops_share"])
  sixteen = sum(by_dtype.get(d, 0) for d in policies.SIXTEEN_BIT)
  rows = {r["name"]: r for r in report["layers"]}
  report.update(
      shares_of="the step's FLOPs", flops_share_16bit=sixteen / total,
      flops_share_32bit=by_dtype.get("float32", 0) / total,
      misaligned_flops_share=sum(rows[n]["flops_share"]
                                 for n in report["misaligned_layers"]))


def _sample(model: keras.Model, batch_size: int, seed: int,
            input_shape: tuple | None, x):
  """What to call `model` with: `x` (a real batch, cut to `batch_size` examples), a
  random batch of `input_shape` (one example's), or one made from what the model
  declares; UserError when none of these exists."""
  if x is not None:
    return keras.tree.map_structure(lambda t: t[:batch_size], x)
  if input_shape:
    return tf.random.stateless_uniform((batch_size,) + tuple(input_shape),
                                       seed=(seed, 0))
  found = observe.sample_input(model, batch_size, seed)
  if found is None:
    raise UserError(f"model {model.name!r} is not built and has no inputs, so its "
                    "input shape is unknown: build it first (call it on a batch, or "
                    "model.build((None, height, width, channels)))")
  return found


def inspect_model(model: keras.Model, batch_size: int = 2, seed: int = 0,
                  input_shape: tuple | None = None, x=None) -> dict[str, Any]:
  """The dtype report of `model`, from one forward and one backward pass: a row per
  layer doing its own work (a custom layer's or nested model's layers, not the
  container). Called on `x` (a real batch) where given, else on `input_shape` (one
  example's) or the inputs the model declares. A model with no call() of its own (a
  GAN, a VAE holding its parts) is the sum of its parts (`inspect_parts`)."""
  if not observe.has_call(model):
    found = observe.parts(model)
    return inspect_parts(model.name, found, batch_size, seed,
                         observe.part_names(model, found))
  x = _sample(model, batch_size, seed, input_shape, x)
  calls, _ = observe.layer_calls(model, x)
  global_policy = policies.plain(keras.mixed_precision.global_policy()).name
  seen = [c for c in calls if c.leaf and not isinstance(c.layer, keras.layers.InputLayer)]
  names = observe.unique_names(calls)
  rows = [_row(call, global_policy, names[id(call.layer)]) for call in seen]
  inputs = observe.describe_inputs(x)
  return {"model": model.name, "policy": global_policy,
          "input_shape": next(iter(inputs.values()), []), "inputs": inputs,
          **_totals(rows, int(model.count_params()), [
              # What one call could not show: layers whose own ops are unseen (their
              # FLOPs are one per output element) and layers that returned no tensor.
              [names[id(c.layer)] for c in seen if not _counted(c.layer)],
              [names[id(c.layer)] for c in seen if c.output is None]],
              _gradient_dtypes(model, x),
              sorted({v.dtype for v in model.trainable_variables}))}


def _totals(rows: list[dict[str, Any]], params: int, unseen: list[list[str]],
            grads: list[str], variables: list[str]) -> dict[str, Any]:
  """A report's rows and what follows them: totals, the layers one call could not
  show (`unseen`: uncounted, no tensor output), the gradients' and variables' dtypes."""
  return {"layers": rows, "params": params, **_shares(rows),
          "uncounted_layers": unseen[0], "no_tensor_output": unseen[1],
          "gradient_dtypes": grads, "variable_dtypes": variables,
          "gradients_match_variables": grads == variables}


def inspect_parts(name: str, models: list[keras.Model], batch_size: int = 2,
                  seed: int = 0, names: list[str] | None = None) -> dict[str, Any]:
  """One report over several models trained together (a GAN's generator and
  discriminator, a VAE's encoder and decoder), each called on the inputs it declares:
  its rows named `part/layer` (`names`: the parts' unique names, observe.part_names),
  FLOPs summed as if each part ran once per example."""
  if not models:
    raise UserError(f"model {name!r} has no call() and holds no model that has one: "
                    "nothing to inspect")
  names = names or observe.part_names(None, models)
  reports = [{**inspect_model(m, batch_size, seed), "model": n}
             for m, n in zip(models, names)]
  named = lambda key: [f"{r['model']}/{n}" for r in reports for n in r[key]]
  union = lambda key: sorted({d for r in reports for d in r[key]})
  rows = [{**row, "name": f"{r['model']}/{row['name']}"}
          for r in reports for row in r["layers"]]
  return {
      "model": name, "parts": [r["model"] for r in reports],
      # The Keras name each part's ops run under (an EMA copy by clone_model: its
      # original's).
      "part_models": [m.name for m in models],
      "policy": reports[0]["policy"], "input_shape": reports[0]["input_shape"],
      "inputs": {f"{r['model']}/{k}": v for r in reports for k, v in r["inputs"].items()},
      **_totals(rows, sum(r["params"] for r in reports),
                [named("uncounted_layers"), named("no_tensor_output")],
                union("gradient_dtypes"), union("variable_dtypes"))}


COLUMNS = ("name", "class", "policy", "compute_dtype", "variable_dtype", "output_dtype",
           "params", "flops", "dims", "aligned8")


def _step_line(report: dict[str, Any]) -> list[str]:
  """The training step's FLOPs, where --mode=inspect counted them from its graph."""
  step = report.get("step_flops")
  if not step:
    return []
  if step["total"] is None:
    return [f"the step's FLOPs at batch {step['batch_size']}: not claimed, its graph "
            f"holds ops of unknown FLOPs ({', '.join(step['uncounted'])})"]
  return [f"the step at batch {step['batch_size']}: {step['total'] / 1e6:,.1f} MFLOPs "
          f"forward and backward ({step['matmul'] / 1e6:,.1f} in matmuls and "
          "convolutions), counted from its traced graph"]


def format_table(report: dict[str, Any], markdown: bool = False) -> str:
  """The report as a text table (or a Markdown table) with its totals below; a column
  of each layer's FLOPs in the step where the step was counted (`with_step`)."""
  counted = any("step_flops" in r for r in report["layers"])
  columns = COLUMNS + (("step_flops",) if counted else ())
  def cell(row, key):
    value = row[key]
    if key == "aligned8":
      return "" if value is None else ("yes" if value else "NO")
    if key in ("flops", "step_flops"):
      return "" if value is None else f"{value / 1e6:.2f}M"
    return str(value)
  rows = [[cell(r, k) for k in columns] for r in report["layers"]]
  header = [{"flops": "fwd flops", "step_flops": "step flops"}.get(k, k) for k in columns]
  if markdown:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
  else:
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header)] + [fmt.format(*r) for r in rows]
  f32 = "; ".join(f"{l['name']} ({l['reason']}, {l['flops_share']:.1%})"
                  for l in report["float32_layers"]) or "none"
  lines += [
      "",
      f"policy {report['policy']}, {report['params']:,} parameters, "
      f"{report['forward_flops_per_example'] / 1e6:.1f} MFLOPs forward per example",
      *_step_line(report),
      f"{report.get('shares_of', 'forward FLOPs')} in 16-bit: "
      f"{report['flops_share_16bit']:.1%}, in 32-bit: "
      f"{report['flops_share_32bit']:.1%}",
      f"float32 work: {f32}",
      *_unseen(report),
      f"FLOPs in layers not aligned to multiples of 8: "
      f"{report['misaligned_flops_share']:.1%} "
      f"({', '.join(report['misaligned_layers']) or 'none'})",
      f"gradient dtypes {report['gradient_dtypes']}, variable dtypes "
      f"{report['variable_dtypes']}: "
      + ("match" if report["gradients_match_variables"] else "MISMATCH"),
  ]
  return "\n".join(lines)


def _unseen(report: dict[str, Any]) -> list[str]:
  """What the model's call could not show, in words (nothing: no lines)."""
  said = {"uncounted_layers": "FLOPs not seen in custom layers' own ops (counted as one "
          "per output element; a layer may define flops_per_example()): ",
          "no_tensor_output": "output dtype not observed (no tensor returned): "}
  return [words + ", ".join(report[key]) for key, words in said.items()
          if report.get(key)]


def _first3(names: list[str]) -> str:
  return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def one_line(report: dict[str, Any]) -> str:
  """The report in one line, for the terminal before training (the table is in
  dtypes.json, TensorBoard's inspect/dtypes and --mode=inspect)."""
  head = (f"mpt: dtypes: {report['params']:,} parameters, "
          f"{report['forward_flops_per_example'] / 1e6:.1f} MFLOPs forward per example")
  # Each layer's own dtype, not the global policy's (--layer_policy over float32).
  if all(r["compute_dtype"] == "float32" for r in report["layers"]):
    parts = [head, "all in float32"]
  else:
    f32 = report["float32_layers"]
    parts = [head, f"{report['flops_share_16bit']:.1%} of them in 16-bit",
             f"{len(f32)} float32 layer(s)" + (
                 f" ({_first3([l['name'] for l in f32])})" if f32 else "")]
  if report.get("uncounted_layers"):
    parts.append(f"FLOPs of {len(report['uncounted_layers'])} custom layer(s) not seen")
  if report["misaligned_layers"]:
    parts.append(f"{report['misaligned_flops_share']:.1%} in layers not aligned to 8 "
                 f"({_first3(report['misaligned_layers'])})")
  return "; ".join(parts)
