"""The model a run trains, built from its config: `build_model(cfg, n_classes)`.

One builder for every part that needs the run's model: the training run
(mpt/train/prepare.py), `--mode=inspect` (mpt/train/dryrun.py), `--policy=auto`'s
timed candidates and the step's cost per policy (mpt/train/cost.py). The model itself
comes from the registry (mpt/models); this module applies the run's flags to it:
`--image_size`, `--model_opts`, the BatchNorm momentum and synchronisation, and
`--batchnorm`'s layers.
"""

import keras

from mpt import config
from mpt import models
from mpt.models import fused_bn


def build_model(cfg: config.Config, n_classes: int, replicas: int = 1) -> keras.Model:
  """The --model variant for --image_size inputs (under the caller's strategy scope),
  with --batchnorm's layers."""
  size = cfg.image_size
  synchronized = cfg.sync_batchnorm and replicas > 1
  model = models.build(cfg.model, (size, size, 3), n_classes,
                       run_options={"bn_momentum": cfg.bn_momentum,
                                    "bn_synchronized": synchronized},
                       **models.parse_opts(cfg.model, cfg.model_opts))
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
