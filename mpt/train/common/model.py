"""The model a run trains, built from its config: `build_model(cfg, n_classes)`.

One builder for every part that needs the run's model: the training run
(mpt/train/cli/prepare.py), `--mode=inspect` (mpt/train/cli/dryrun.py), `--policy=auto`'s
timed candidates and the step's cost per policy (mpt/train/before_step1/cost.py). The model itself
comes from the registry (mpt/models); this module applies the run's flags to it:
`--image_size`, `--model_opts`, the BatchNorm momentum and synchronisation, and
`--batchnorm`'s layers, and `--layer_policy`'s per-layer policies.
"""

import keras

from mpt import config
from mpt import models
from mpt.errors import UserError
from mpt.measure import policies
from mpt.models import fused_bn
from mpt.train.common.plan import Plan


def build_model(cfg: config.Config, n_classes: int, replicas: int = 1) -> keras.Model:
  """The --model variant for --image_size inputs (under the caller's strategy scope),
  with --batchnorm's layers and --layer_policy's policies (`cfg`: the run's Plan)."""
  plan = Plan.of(cfg)
  model = _with_batchnorm(plan, n_classes, replicas)
  apply_layer_policy(model, plan.layers)
  return model


def apply_layer_policy(model: keras.Model, pairs: list[tuple[str, str]]) -> dict[str, int]:
  """Sets each layer's policy to that of the first (pattern, policy) matching its
  class or its whole name; {pattern: layers set}. UserError naming a pattern that
  matches no layer. A built layer keeps its float32 variables (all three policies
  keep them in float32) and computes in the new dtype from its next trace on."""
  counts = {pattern: 0 for pattern, _ in pairs}
  matched = set()
  for layer in fused_bn.all_layers(model):
    if isinstance(layer, keras.Model):
      continue
    hits = [(pattern, policy) for pattern, policy in pairs
            if policies.matches(layer, pattern)]
    matched.update(pattern for pattern, _ in hits)
    if hits:
      layer.dtype_policy = hits[0][1]
      counts[hits[0][0]] += 1
  for pattern, n in counts.items():
    if pattern not in matched:
      classes = sorted({type(l).__name__ for l in fused_bn.all_layers(model)})
      raise UserError(f"--layer_policy: {pattern!r} matches no layer of {model.name} "
                      f"(its classes: {', '.join(classes)})")
    if not n:
      raise UserError(f"--layer_policy: {pattern!r} sets no layer: an earlier "
                      "pattern takes every layer it matches")
  return counts


def _with_batchnorm(cfg: Plan, n_classes: int, replicas: int) -> keras.Model:
  size = cfg.image_size
  synchronized = cfg.sync_batchnorm and replicas > 1
  model = models.build(cfg.model, (size, size, 3), n_classes,
                       run_options={"bn_momentum": cfg.bn_momentum,
                                    "bn_synchronized": synchronized},
                       **cfg.opts)
  if cfg.batchnorm == "fused":
    if synchronized:  # The fused kernel has no cross-replica statistics.
      print(f"mpt: --batchnorm=fused: BatchNorm is synchronized across {replicas} "
            "replicas, which only Keras' layer does; keeping Keras' layer", flush=True)
      return model
    why = fused_bn.unswappable(model)
    if why:
      print(f"mpt: --batchnorm=fused: keeping Keras' BatchNormalization for "
            f"{model.name}: {why}", flush=True)
      return model
    model, _, kept = fused_bn.with_fused_batchnorm(model)
    if kept:
      print(f"mpt: --batchnorm=fused: {kept} BatchNormalization layer(s) kept as "
            "Keras' (not over the last axis, or without center/scale)", flush=True)
  return model
