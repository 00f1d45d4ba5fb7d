"""Figures of a script's run that misled before (issue 40): a data-wait headline that a
few long fetches made, and a float16 loss that was never scaled while the diagnosis
said "loss_scale: checked, nothing found"."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import mpt
from mpt.diagnose.detectors import timing
from mpt.diagnose.evidence import Evidence
from mpt.measure import instrument
from mpt.records.summary import RunSummary


def _timer(waits_ms: list[float], step_ms: float = 1.4) -> instrument.StepTimer:
  """A timer that timed these steps (no warm-up), the first an epoch's start."""
  n = len(waits_ms)
  return instrument.StepTimer(0, {"durations_ms": [step_ms + w for w in waits_ms],
                                  "waits_ms": list(waits_ms), "timed": [True] * n,
                                  "epoch_starts": [0, n // 2]})


def _finding(timer: instrument.StepTimer):
  stats = timer.stats()
  s = RunSummary(status="completed", ms_per_step=stats["median"], step_time_ms=stats,
                 data_wait_share=stats["data_wait_share"], api="mpt.track")
  return timing.input_bound(Evidence(s, None)), stats


def test_a_few_long_fetches_do_not_make_a_run_input_bound():
  """The shape the issue saw: a 0.3 ms median wait in a 1.7 ms step, and an epoch's
  first fetches long. The sum share (what the headline was) is 86%; a typical step
  waits 0.3 / 1.7 = 17.6% of its time, and the long fetches are reported apart."""
  waits = [0.3] * 40
  waits[0] = waits[20] = 150.0  # Two epoch starts (a shuffle buffer refilled).
  waits[7] = 40.0  # One one-off long fetch.
  found, stats = _finding(_timer(waits))
  assert stats["data_wait_share"] > 0.8  # What the headline said before: "83.8%".
  assert stats["data_wait_share_median"] == pytest.approx(0.3 / 1.7)
  assert stats["data_wait_epoch_starts"] == [2, 300.0]
  assert stats["data_wait_one_off"] == [1, 40.0]
  assert found is not None  # 17.6% of a typical step is input bound, said as such:
  assert found.impact == pytest.approx(0.3 / 1.7) and found.severity == "medium"
  assert found.evidence[0].startswith("the median step waits 17.6% of its time")
  assert found.evidence[1] == ("summed over all steps 86.2%, of which 2 epoch-start "
                               "fetches (300 ms) and 1 one-off long fetches (40 ms)")


def test_one_off_fetches_alone_are_not_input_bound():
  waits = [0.05] * 40
  waits[0] = waits[20] = 150.0
  found, stats = _finding(_timer(waits))
  assert stats["data_wait_share"] > 0.8 and stats["data_wait_share_median"] < 0.05
  assert found is None


class NoScaleStep(keras.Model):
  """A custom train_step that never scales its loss (the issue's shape)."""

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply(grads, self.trainable_variables)
    return {"loss": loss}


@pytest.mark.parametrize("scales", [False, True])
def test_a_float16_loss_never_scaled_is_a_high_finding(tmp_path, scales):
  keras.mixed_precision.set_global_policy("mixed_float16")
  inputs = keras.Input((4,))
  outputs = keras.layers.Dense(1, dtype="float32")(keras.layers.Dense(8)(inputs))
  model = (keras.Model if scales else NoScaleStep)(inputs, outputs)
  model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), "mse")
  model.fit(np.ones((16, 4)), np.ones((16, 1)), batch_size=4, epochs=1, verbose=0,
            callbacks=mpt.callbacks(str(tmp_path / "r"), batch_size=4, warmup_steps=1,
                                    sample_every=None))
  diagnosis = json.loads((tmp_path / "r" / "diagnosis.json").read_text())
  ids = [f["id"] for f in diagnosis["findings"]]
  assert ("loss_never_scaled" in ids) == (not scales)
  if not scales:
    finding = diagnosis["findings"][ids.index("loss_never_scaled")]
    assert finding["severity"] == "high" and "scale_loss(loss)" in finding["next_step"]
    assert "1/32768" in finding["evidence"][0]
  else:
    assert "loss_never_scaled" in diagnosis["checked_clear"]


def test_the_batch_fed_wins_over_the_batch_given(tmp_path, capsys):
  """mpt.callbacks(batch_size=64) on a fit of batch 4: said, and the figures per
  example use the batch fed (they were 16x too high)."""
  from mpt.records import summary as summary_lib
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
  model.compile("sgd", "mse")
  model.fit(np.ones((16, 3)), np.ones((16, 1)), batch_size=4, epochs=1, verbose=0,
            callbacks=mpt.callbacks(str(tmp_path / "r"), batch_size=64, warmup_steps=1,
                                    sample_every=None, diagnose=False))
  s = summary_lib.read(tmp_path / "r" / "summary.json")
  assert (s.batch_size, s.program.batch_size, s.program.batch_size_given) == (4, 4, 64)
  assert s.examples_per_sec == pytest.approx(4 / s.ms_per_step * 1e3)
  assert "batch_size=64 given, but the first batch fed has 4 examples" in \
      capsys.readouterr().err
