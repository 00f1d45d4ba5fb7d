"""Mixed-precision policy: set it, describe it, check the hardware, build the optimizer.

The policy is set globally before the model is built, so every layer picks it up
without a dtype argument. Under mixed_float16 the optimizer is a Keras
`LossScaleOptimizer` with dynamic loss scaling in both loops (Keras `compile` would
wrap it itself for fit; mpt wraps it first so fit and the custom loop share the very
same optimizer). float16 has too few exponent bits for small gradients; bfloat16 has
float32's range and needs no loss scaling.
"""

import keras

from mpt import config
from mpt import speech
from mpt.machine import fastpath
from mpt.machine import hardware
from mpt.machine import kernels
from mpt.models import fused_bn
from mpt.records.cost import Cost
from mpt.records.verdict import PolicyVerdict


def set_policy(name: str) -> keras.DTypePolicy:
  """Sets the global Keras dtype policy; returns it."""
  keras.mixed_precision.set_global_policy(name)
  return keras.mixed_precision.global_policy()


def describe(policy: keras.DTypePolicy) -> str:
  return (f"Policy: {policy.name}  compute dtype: {policy.compute_dtype}  "
          f"variable dtype: {policy.variable_dtype}")


def layer_classes(model: keras.Model) -> list[str]:
  """The class names of a model's layers, those nested in models and custom layers
  included."""
  return [type(layer).__name__ for layer in fused_bn.all_layers(model)]


def check_speed(policy: str, layer_classes, cost: Cost | None = None,
                api: str = "cli", say: bool = True) -> PolicyVerdict:
  """The measured verdict on `policy` for a model with these layers, on this machine
  (mpt/machine/fastpath.py); prints ONE warning when it is slow, before step 1.

  This model's step timed per policy (`cost`, mpt/train/before_step1/cost.py) decides how slow; the
  kernel table ($MPT_KERNELS, the cache; on a GPU the model's step profiled per
  policy, `cost.gpu_kernels`) names the kernel to blame. A ~10 s probe fills a
  missing table only to explain a slowdown the step measured, or where the step was
  not timed (the table then decides alone, and its warning says it is a guess from
  representative shapes); with neither, the CPU flags do (`hardware.fast_path`, the
  diagnosis' rule too). `say`: print the warning (once, before step 1)."""
  gpu_caps = hardware.gpu_compute_capabilities()
  if cost is not None and cost.gpu_kernels is not None:  # This model's, profiled.
    table, note = cost.gpu_kernels.as_table(), None
  elif gpu_caps:  # The CPU's table measures nothing a GPU runs.
    table, note = None, None
  else:
    measured = (cost.ratios() if cost else {}).get(policy)
    table, note = kernels.table(probe_if_missing=measured is None
                                or measured >= fastpath.SLOW)
  found = fastpath.verdict(policy, table, fastpath.families_of(layer_classes),
                           hardware.cpu_flags(), gpu_caps,
                           "" if gpu_caps else f"this CPU ({hardware.cpu_name()})",
                           cost.predicted() if cost else None,
                           (cost.bounds() if cost else {}).get(policy))
  found.source = (cost.source if found.evidence == "cost"
                  else (table or {}).get("source", "CPU flags"))
  found.note = note or found.note or (table or {}).get("note")
  if (note or found.bound) and found.note and say:
    print(f"mpt: note: {found.note}", flush=True)
  if found.text:
    found.text += f" ({found.contradicts})" if found.contradicts else ""
    found.text = speech.for_api(found.text, api)  # A script's run: its API's words.
    if say:
      print(f"WARNING: {found.text}", flush=True)  # Once: not also through absl's log.
  return found


def make_optimizer(policy: str, learning_rate: float, loss_scale: str = "dynamic",
                   scaled: bool | None = None) -> keras.optimizers.Optimizer:
  """Adam; where a layer computes in float16 (`scaled`; default: under mixed_float16)
  with dynamic loss scaling, or a fixed loss scale: Keras' `loss_scale_factor`, the
  loss multiplied by it and the gradients divided by it, no non-finite step skipped."""
  if not (config.scales(policy) if scaled is None else scaled):
    return keras.optimizers.Adam(learning_rate)
  if loss_scale != "dynamic":
    return keras.optimizers.Adam(learning_rate, loss_scale_factor=float(loss_scale))
  return keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(learning_rate))


def loss_scale(optimizer: keras.optimizers.Optimizer) -> float | None:
  """The current (dynamic or fixed) loss scale, or None without loss scaling."""
  if optimizer.loss_scale_factor is not None:
    return float(optimizer.loss_scale_factor)
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    if not optimizer.built:  # The scale variable exists once the optimizer is built.
      return float(optimizer.initial_scale)
    return float(optimizer.dynamic_scale.numpy())
  return None


def scalars(optimizer: keras.optimizers.Optimizer | None, steps_run: int) -> dict[str, float]:
  """The precision/ scalars of TensorBoard: the loss scale (1.0 without loss scaling)
  and the steps skipped so far; none without an optimizer (a loop that gave none)."""
  if optimizer is None:
    return {}
  return {"loss_scale": loss_scale(optimizer) or 1.0,
          "skipped_steps": skipped_steps(optimizer, steps_run)}


def skipped_steps(optimizer: keras.optimizers.Optimizer, steps_run: int) -> int:
  """Steps whose update was skipped for non-finite gradients: a LossScaleOptimizer
  does not advance the inner optimizer's `iterations` on a skipped step, so the gap
  between steps run and iterations counts them, in fit and the custom loop alike."""
  return int(steps_run - int(optimizer.iterations.numpy()))
