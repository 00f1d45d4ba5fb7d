"""The optimizers of a user's program, watched over its run (mpt.callbacks, mpt.track).

A program may step several optimizers (a GAN's two, set by its own compile()), keep a
default one compile() made and its train_step never uses, or recompile with a new one
between fits. `Optimizers` finds them (the ones the loop gave, else the model's
`optimizer` and any optimizer the model holds as an attribute), counts each one's
updates and skipped steps over the fits it was in use, and reads each loss scale. The
run's figures: the lowest loss scale of those that stepped, and the most steps any of
them skipped (an optimizer that never stepped counts for nothing).

It also sees whether the program scaled its loss: each optimizer's `scale_loss` and
`apply` are wrapped (instance attributes, for this run's optimizers only) to count
their calls, which happen while a step is traced or run eagerly. A LossScaleOptimizer
whose apply() ran while scale_loss() never did divides unscaled gradients by its scale
(the diagnosis' "float16 loss never scaled").
"""

import dataclasses

import keras

from mpt.records.program import OptimizerRecord
from mpt.train.common import precision


@dataclasses.dataclass
class Watched:
  """One optimizer: its updates and skips over closed segments, the open segment."""
  opt: keras.optimizers.Optimizer
  updates: int = 0
  skipped: int = 0
  segment: tuple[int, int] | None = None  # (steps done, iterations) at its start.
  scale_calls: int = 0
  apply_calls: int = 0

  @property
  def scaling(self) -> bool:
    return isinstance(self.opt, keras.optimizers.LossScaleOptimizer)

  def now(self, steps: int) -> tuple[int, int]:
    """(updates, skipped) so far, the open segment's included."""
    if self.segment is None:
      return self.updates, self.skipped
    steps0, iterations0 = self.segment
    moved = int(self.opt.iterations.numpy()) - iterations0
    missed = max(0, (steps - steps0) - moved) if self.scaling else 0
    return self.updates + moved, self.skipped + missed

  def stepped(self) -> bool:
    return self.now(0)[0] > 0 or self.apply_calls > 0


def find(models, given) -> list[keras.optimizers.Optimizer]:
  """The loop's optimizers (`given`: one or several), else every optimizer the models
  hold: `model.optimizer` and optimizer attributes (a GAN's d_optimizer, ...)."""
  if given is not None:
    return list(given) if isinstance(given, (list, tuple)) else [given]
  found = []
  for model in models:
    for value in [getattr(model, "optimizer", None), *vars(model).values()]:
      for v in (value if isinstance(value, (list, tuple)) else [value]):
        if isinstance(v, keras.optimizers.Optimizer) and all(v is not f for f in found):
          found.append(v)
  return found


class Optimizers:
  """See the module docstring."""

  def __init__(self):
    self.watched: list[Watched] = []

  def begin(self, optimizers: list, steps: int) -> None:
    """A fit (or the loop) starts at `steps` done, stepping `optimizers`: segments of
    those no longer used close, new ones open."""
    for w in self.watched:
      if w.segment is not None and all(w.opt is not o for o in optimizers):
        w.updates, w.skipped = w.now(steps)
        w.segment = None
    for opt in optimizers:
      w = next((w for w in self.watched if w.opt is opt), None)
      if w is None:
        w = Watched(opt)
        self.watched.append(w)
        _count_calls(w)
      if w.segment is None:
        w.segment = (steps, int(opt.iterations.numpy()))

  def used(self) -> list[Watched]:
    """The optimizers that stepped; all of them while none has yet."""
    stepped = [w for w in self.watched if w.stepped()]
    return stepped or self.watched

  def skipped(self, steps: int) -> int:
    return max((w.now(steps)[1] for w in self.used()), default=0)

  def loss_scale(self) -> float | None:
    scales = [s for s in (precision.loss_scale(w.opt) for w in self.used())
              if s is not None]
    return min(scales) if scales else None

  def scalars(self, steps: int) -> dict[str, float]:
    """TensorBoard's precision/ scalars (none without an optimizer)."""
    if not self.watched:
      return {}
    return {"loss_scale": self.loss_scale() or 1.0, "skipped_steps": self.skipped(steps)}

  def records(self, steps: int) -> list[OptimizerRecord]:
    return [_record(w, steps) for w in self.watched]


def _record(w: Watched, steps: int) -> OptimizerRecord:
  opt = w.opt
  inner = getattr(opt, "inner_optimizer", None)
  updates, skipped = w.now(steps)
  try:
    rate = float(keras.ops.convert_to_numpy((inner or opt).learning_rate))
  except (TypeError, ValueError):  # A schedule's value is not one number.
    rate = None
  needs_scaling = w.scaling or opt.loss_scale_factor is not None
  return OptimizerRecord(
      name=opt.name, cls=type(opt).__name__,
      inner=type(inner).__name__ if inner is not None else None, learning_rate=rate,
      loss_scale=precision.loss_scale(opt),
      skipped_steps=skipped if w.scaling and w.stepped() else None,
      updates=updates,
      scale_loss_called=(True if w.scale_calls else False if w.apply_calls else None)
      if needs_scaling else None,
      apply_called=bool(w.apply_calls))


def _count_calls(w: Watched) -> None:
  """Counts the program's calls of the optimizer's scale_loss() and apply()."""
  for method, count in (("scale_loss", "scale_calls"), ("apply", "apply_calls")):
    def counted(*args, _fn=getattr(w.opt, method), _count=count, **kwargs):
      setattr(w, _count, getattr(w, _count) + 1)
      return _fn(*args, **kwargs)
    setattr(w.opt, method, counted)
