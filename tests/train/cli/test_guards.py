"""Overflow, divergence and signals, in both loops."""

import json
import pathlib
import signal

import numpy as np
import pytest
import tensorflow as tf

from mpt.train.cli import guards
from mpt.train.cli import run as train

from helpers import mpt_forked, read_scalars, start_and_wait_for_an_epoch, tiny_flags


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_float16_overflow_is_skipped_and_training_recovers(tiny, loop):
  summary = train.train_and_evaluate(tiny(loop=loop, policy="mixed_float16",
                                          fault_factor=1e30, fault_steps="3,5"))
  assert summary["status"] == "completed"
  assert summary["skipped_steps"] >= 3  # The three poisoned steps at least.
  assert summary["loss_scale"] <= 2.0**15 / 8
  losses = [v for _, v in read_scalars(summary["run_dir"])["train/loss"]]
  assert losses[0] > 1e20  # Epoch 1's mean holds the huge (finite) losses ...
  assert np.isfinite(losses[-1]) and losses[-1] < 5  # ... and training went on.
  skipped = read_scalars(summary["run_dir"])["precision/skipped_steps"]
  assert skipped[-1][1] == summary["skipped_steps"]
  # Each poisoned step replayed (the loss' factor is outside what a replay runs: the
  # model and the loss are finite), said in summary.json as numerics.json says it.
  causes = {c["step"]: c["op"] for c in summary["skip_causes"]}
  assert 3 in causes and all(causes[s] is None for s in (3, 4, 5) if s in causes)


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tiny, loop):
  summary = train.train_and_evaluate(tiny(loop=loop, fault_factor=float("nan"),
                                          fault_steps="10,10", checkpoint_every=4))
  assert summary["status"] == "diverged"
  assert "diverged at step 10: loss is nan" in summary["message"]
  assert "last good checkpoint" in summary["message"] and "ckpt-8" in summary["message"]
  run = pathlib.Path(summary["run_dir"])
  assert tf.train.latest_checkpoint(str(run / "checkpoints")).endswith("ckpt-8")
  reader = tf.train.load_checkpoint(str(run / "checkpoints"))
  assert all(np.all(np.isfinite(reader.get_tensor(n)))
             for n, dtype in reader.get_variable_to_dtype_map().items()
             if dtype.is_floating)
  assert json.loads((run / "summary.json").read_text())["status"] == "diverged"


# A dynamic scale starts at 2**15 and halves at each overflowing step: below
# --min_loss_scale (default 1) the run stops as diverged.
@pytest.mark.parametrize("loop,minimum,fell_to,steps", [
    ("custom", None, "0.5", 16), ("fit", 1024, "512", 6), ("custom", 1024, "512", 6)])
def test_collapsing_loss_scale_is_divergence(tiny, loop, minimum, fell_to, steps):
  extra = {} if minimum is None else {"min_loss_scale": minimum}
  summary = train.train_and_evaluate(tiny(loop=loop, policy="mixed_float16",
                                          fault_factor=1e30, fault_steps="1,24", **extra))
  assert summary["status"] == "diverged"
  assert (f"loss scale fell to {fell_to} (< --min_loss_scale={minimum or 1})"
          in summary["message"])
  assert summary["steps"] == steps


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_fixed_loss_scale_never_skips_so_an_overflow_diverges(tiny, loop):
  summary = train.train_and_evaluate(tiny(loop=loop, policy="mixed_float16",
                                          loss_scale="256", fault_factor=1e30,
                                          fault_steps="3,3", log_every=1))
  # Step 3's overflowed gradients are applied (a fixed scale never skips), so the
  # weights turn NaN and step 4's loss is NaN; the scale itself never moves.
  assert summary["status"] == "diverged"
  assert "diverged at step 4: loss is nan" in summary["message"]
  assert summary["loss_scale"] == 256.0 and summary["skipped_steps"] == 0
  scale = read_scalars(summary["run_dir"])["precision/loss_scale"]
  assert [s for s, _ in scale] == [1, 2, 3, 4] and {v for _, v in scale} == {256.0}


def test_cli_exit_status_for_divergence(tmp_path):
  proc = mpt_forked(*tiny_flags(tmp_path, "--fault_factor=nan", "--fault_steps=2,2",
                                "--epochs=1"))
  assert proc.returncode == 3
  assert "mpt: diverged at step 2: loss is nan; last good checkpoint: none" in proc.stdout


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_sigterm_saves_a_checkpoint_and_says_interrupted(tmp_path, children, loop):
  proc = start_and_wait_for_an_epoch(children, tmp_path, "--checkpoint_every=0",
                                     f"--loop={loop}")
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err  # 128 + SIGTERM, as a shell reports it.
  summary = json.loads((tmp_path / "logs" / "r" / "summary.json").read_text())
  assert summary["status"] == "interrupted" and summary["loop"] == loop
  assert summary["checkpoint"].endswith(f"ckpt-{summary['steps']}")
  assert f"interrupted at step {summary['steps']}" in out


@pytest.mark.parametrize("first_written", [True, False])
def test_a_second_signal_says_both_and_exits(capfd, monkeypatch, first_written):
  """A second signal can arrive while the first handler has recorded its signal but
  not yet written (the suite saw that once): the user still reads both lines."""
  exits = []
  monkeypatch.setattr(guards.os, "_exit", lambda code: exits.append(code))
  stop = guards.SignalStop(lambda: 1, steps_per_epoch=2)
  if first_written:
    stop._handle(signal.SIGINT, None)
  else:
    stop.signal = signal.SIGINT  # The first handler, interrupted after this line.
  stop._handle(signal.SIGTERM, None)
  err = capfd.readouterr().err
  assert exits == [143]  # 128 + the second signal (SIGTERM).
  assert err.count("mpt: SIGINT: stopping after this step") == 1, err
  assert err.index("stopping after this step") < err.index("second signal, exiting now")


def test_a_stop_at_an_epochs_last_step_waits_for_its_evaluation_and_checkpoint():
  """A signal during an epoch's last step (or its evaluation) stops the run at the
  epoch's end, after the checkpoint, which a stop before evaluation could not keep;
  during any other step, at that step's end."""
  done = [3]
  stop = guards.SignalStop(lambda: done[0], steps_per_epoch=2)
  stop.signal = signal.SIGTERM
  with pytest.raises(guards.Interrupted, match="SIGTERM"):
    stop.on_train_batch_end(0)  # Step 3, with epochs of 2 steps: mid-epoch.
  done[0] = 4
  stop.on_train_batch_end(1)  # The epoch's last step: not yet,
  stop.on_test_batch_end(0)  # nor during its evaluation,
  with pytest.raises(guards.Interrupted, match="SIGTERM"):  # but at the epoch's end.
    stop.on_epoch_end(1)
