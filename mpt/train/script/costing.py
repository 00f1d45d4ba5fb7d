"""A script's step cost, as a Keras callback: at the end of each fit's warm-up, the
step the program runs timed per policy (stepcost.py, imported only then: a script
that never gets there loads none of the cost's machinery), and the policy verdict
said on it; at each fit's end, its own policy checked against the fit's own steps.
"""

import keras

from mpt.train.common import precision


class StepCost(keras.callbacks.Callback):
  """Over the run's state (library.py's RunFolder)."""

  def __init__(self, run):
    super().__init__()
    self.run, self.costed = run, 0  # The fits whose step cost was taken.

  def on_train_batch_end(self, batch, logs=None):
    run = self.run
    if self.costed < len(run.program.fits) and len(run.timer.here) >= max(
        1, run.timer.warmup_steps):  # Each fit's warm-up done: its step's cost.
      self.costed = len(run.program.fits)
      run.parts.attempt("cost", _stepcost().for_fit, run)
      run.before.verdict = run.parts.attempt(
          "verdict", precision.check_speed, run.policy_name(), run.layer_classes(),
          run.before.cost, run.opts.api)

  def on_train_end(self, logs=None):
    fits = self.run.program.fits
    if fits:
      fits[-1].steps = self.run.timer.steps - sum(f.steps for f in fits[:-1])
    if fits and fits[-1].cost is not None:
      self.run.parts.attempt("cost", _stepcost().check, self.run)


def _stepcost():
  from mpt.train.script import stepcost  # pylint: disable=import-outside-toplevel
  return stepcost
