"""Best effort inside a user's training: mpt never ends the training it measures.

Inside a user's `fit` (mpt.callbacks) or loop (mpt.track), every part of mpt's
measurement runs through `Parts.attempt`: a part that raises is said once, in one
line (`mpt: <part> not measured: <error>`), recorded in summary.json's `not_measured`
under its name, and the training goes on. `Guarded` wraps a whole callback the same
way, so that no hook of mpt's can raise into Keras' loop, whatever a part forgot.
An argument error that can be seen before step 1 is still a UserError, raised before
training starts (mpt/train/script/library.py checks those first).

The parts, by name (`PARTS`): each is one thing mpt adds to the user's run.
`MPT_FAIL_PART=NAME[,NAME...]` makes the named parts raise where they start, so the
tests can prove each is caught (unset: nothing happens).
"""

import os
import sys
from typing import Any, Callable

import keras

PARTS = {
    "inspect": "the per-layer dtype inspection and FLOP count (dtypes.json)",
    "verdict": "the kernel verdict on the policy before step 1",
    "sampler": "the CPU/GPU utilisation sampler",
    "writer": "mpt's TensorBoard scalars and texts",
    "precision": "the loss scale and skipped-step readers",
    "data_wait": "the timed batch fetch",
    "timer": "the step timer",
    "record": "summary.json and runs.csv",
    "diagnosis": "the diagnosis after the run",
    "profile": "the profiler window",
    "numerics": "the per-layer numerics sample (numerics.json)",
}


class InjectedFault(RuntimeError):
  """What `MPT_FAIL_PART` raises in a part (tests)."""


def inject(part: str) -> None:
  """Raises InjectedFault if `MPT_FAIL_PART` names `part`."""
  names = os.environ.get("MPT_FAIL_PART", "")
  if names and part in names.split(","):
    raise InjectedFault(f"injected fault in {part} (MPT_FAIL_PART)")


class Parts:
  """The failures of one run's parts: `not_measured` (summary.json's, by part) and
  the one line said for each."""

  def __init__(self, not_measured: dict[str, str]):
    self.not_measured = not_measured
    self.failed: set[str] = set()

  def attempt(self, part: str, fn: Callable[..., Any], *args, default=None, **kwargs):
    """fn(*args, **kwargs), or `default` when it raises (said and recorded)."""
    try:
      inject(part)
      return fn(*args, **kwargs)
    except Exception as e:  # pylint: disable=broad-except
      self.fail(part, e)
      return default

  def fail(self, part: str, error: BaseException) -> None:
    why = f"{type(error).__name__}: {error}".strip().splitlines()[0][:300]
    self.not_measured[part] = f"{PARTS.get(part, part)} failed ({why}); " \
        "the training went on"
    if part not in self.failed:  # Once per part, however many steps fail.
      self.failed.add(part)
      print(f"mpt: {part} not measured: {why} (the training goes on)",
            file=sys.stderr, flush=True)


HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
         "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end",
         "on_test_batch_begin", "on_test_batch_end", "on_predict_begin",
         "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end")


class Guarded(keras.callbacks.Callback):
  """`inner`'s hooks, each through `parts.attempt(part, ...)`: a hook that raises is
  recorded as `part` not measured, and Keras' loop never sees the error."""

  def __init__(self, inner: keras.callbacks.Callback, part: str, parts: Parts):
    super().__init__()
    self.inner, self.part, self.parts = inner, part, parts
    for hook in HOOKS:
      setattr(self, hook, self._guard(getattr(inner, hook)))

  def _guard(self, hook):
    def guarded(*args, **kwargs):
      self.parts.attempt(self.part, hook, *args, **kwargs)
    return guarded

  def set_model(self, model):
    super().set_model(model)
    self.inner.set_model(model)

  def set_params(self, params):
    super().set_params(params)
    self.inner.set_params(params)
