"""Checkpoints: SIGKILL-and-resume equivalence, fallback, determinism, run folders."""

import json
import pathlib
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from mpt.train import checkpoint
from mpt import config
from mpt import models
from mpt.train import precision
from mpt.records import rundir
from mpt.train import run as train
from mpt.errors import UserError

from helpers import mpt, read_scalars, wait_for

SCALARS_ONCE_PER_RUN = ("final/",)  # Written at a run's end: the killed run had none.
SCALARS_BY_THE_CLOCK = ("util/",)  # Written at the first step after each sample.


def scalar_steps(run_dir) -> dict[str, list[int]]:
  """{scalar tag: its steps in file order}, without the end-of-run summaries."""
  return {tag: [s for s, _ in values] for tag, values in read_scalars(run_dir).items()
          if not tag.startswith(SCALARS_ONCE_PER_RUN)}


def assert_same_steps(run_dir, expected: dict[str, list[int]]) -> None:
  """Every scalar tag at the steps `expected` lists (tags the utilisation sampler
  writes, whose steps depend on the clock: at increasing steps, none twice)."""
  got = scalar_steps(run_dir)
  assert got.keys() == expected.keys()
  for tag, steps in got.items():
    if tag.startswith(SCALARS_BY_THE_CLOCK):
      assert steps == sorted(set(steps)) and steps, (tag, steps)
    else:
      assert steps == expected[tag], tag


def newest_event_step(run_dir) -> int:
  steps = [s for values in scalar_steps(run_dir).values() for s in values]
  return max(steps, default=-1)


def latest_checkpoint_step(run_dir) -> int:
  latest = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
  return int(latest.rsplit("-", 1)[1]) if latest else -1


def final_weights(run_dir: pathlib.Path) -> dict[str, np.ndarray]:
  reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
          if name.startswith(("model/", "optimizer/"))}


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_resume_after_sigkill_matches_an_uninterrupted_run_bitwise(tmp_path, loop,
                                                                   children):
  common = [sys.executable, "-m", "mpt.main", f"--loop={loop}", "--deterministic",
            "--epochs=5", "--image_size=32", "--batch_size=8", "--synthetic_train=64",
            "--synthetic_val=16", "--synthetic_px=40", "--checkpoint_every=3",
            "--log_every=1", "--sample_every=0.1", "--verbose=0", f"--data_dir={tmp_path}",
            f"--logdir={tmp_path}/logs"]
  # Both runs at once: determinism does not depend on what else runs on the machine,
  # and the data generation is safe against a concurrent writer (mpt/train/synthetic.py).
  full = children.start(common + ["--run_name=full"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE)
  killed = children.start(common + ["--run_name=killed"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  run = tmp_path / "logs" / "killed"
  # Killed once scalars past its newest checkpoint are on disk: those must be pruned.
  # The child is frozen while its folder is read, so nothing changes between the
  # look and the kill.
  past_checkpoint = lambda: run.exists() and (
      0 <= latest_checkpoint_step(run) < newest_event_step(run))

  def frozen_past_checkpoint() -> bool:
    if not past_checkpoint():
      return False
    killed.send_signal(signal.SIGSTOP)
    if past_checkpoint():
      return True
    killed.send_signal(signal.SIGCONT)
    return False
  assert wait_for(frozen_past_checkpoint, timeout=180, every=0.05)
  killed.send_signal(signal.SIGKILL)
  killed.wait(timeout=60)
  _, err = full.communicate(timeout=300)
  assert full.returncode == 0, err
  assert not (run / "summary.json").exists()  # It really died before finishing.
  restored_at, written = latest_checkpoint_step(run), newest_event_step(run)
  assert 3 <= restored_at < written < 40, (restored_at, written)

  resumed = mpt(f"--resume={run}", "--verbose=0")
  assert resumed.returncode == 0, resumed.stderr
  assert f"resuming {run} at step {restored_at}" in resumed.stdout
  summary = json.loads((run / "summary.json").read_text())
  assert summary["status"] == "completed" and summary["resumed"]
  assert summary["steps"] == 40 and summary["epochs_completed"] == 5
  # TensorBoard curves continue at the right steps, none twice, none missing, for
  # every scalar the uninterrupted run wrote.
  expected = scalar_steps(tmp_path / "logs" / "full")
  assert expected["train/loss"] == list(range(8, 41, 8))
  assert expected["perf/step_time_ms"] == list(range(1, 41))
  assert_same_steps(run, expected)

  a, b = final_weights(tmp_path / "logs" / "full"), final_weights(run)
  assert a.keys() == b.keys() and len(a) > 10
  diff = max(float(np.max(np.abs(a[k] - b[k]))) if a[k].size else 0.0 for k in a)
  print(f"{loop}: killed with events to step {written}, resumed at step {restored_at}, "
        f"max abs weight difference {diff}")
  assert diff == 0.0


def test_two_deterministic_runs_give_identical_losses(tiny):
  first = train.train_and_evaluate(tiny(deterministic=True, loop="fit"))
  second = train.train_and_evaluate(tiny(deterministic=True, loop="fit"))
  a, b = read_scalars(first["run_dir"]), read_scalars(second["run_dir"])
  assert a["train/loss"] == b["train/loss"] and a["eval/loss"] == b["eval/loss"]


def test_corrupt_latest_checkpoint_falls_back_and_prunes_the_later_events(tiny, capsys):
  done = train.train_and_evaluate(tiny(checkpoint_every=4, loop="custom", log_every=2,
                                       sample_every=0.05))
  run = pathlib.Path(done["run_dir"])
  ckpts = run / "checkpoints"
  assert sorted(p.name for p in ckpts.glob("*.index")) == [
      "ckpt-16.index", "ckpt-20.index", "ckpt-24.index"]
  before = scalar_steps(run)
  assert before["perf/step_time_ms"] == list(range(2, 25, 2))
  data = next(ckpts.glob("ckpt-24.data-*"))
  data.write_bytes(data.read_bytes()[:100])
  capsys.readouterr()
  resumed = train.train_and_evaluate(config.Config(resume=done["run_dir"], verbose=0))
  out = capsys.readouterr().out
  assert f"WARNING: checkpoint {ckpts / 'ckpt-24'} does not restore (" in out
  assert "trying the one before it" in out
  assert f"mpt: resuming {run} at step 20" in out
  assert resumed["status"] == "completed" and resumed["steps"] == 24
  assert resumed["checkpoint"].endswith("ckpt-24")  # Written again from step 20.
  # Steps 21-24 were written twice, by the first run and by the resumed one; the
  # first run's copies are gone, so each scalar has the same steps as before.
  assert_same_steps(run, before)


def test_loss_scale_is_checkpointed(tiny):
  summary = train.train_and_evaluate(tiny(policy="mixed_float16", fault_factor=1e30,
                                          fault_steps="2,4", epochs=1))
  assert summary["loss_scale"] <= 2.0**15 / 8
  precision.set_policy("mixed_float16")
  model = models.build("seed_convnet", (32, 32, 3), 10)
  opt = precision.make_optimizer("mixed_float16", 1e-3)
  opt.build(model.trainable_variables)
  ckpt = checkpoint.Checkpointer(pathlib.Path(summary["run_dir"]), model, opt)
  step, epoch, state = ckpt.restore()
  assert (step, epoch) == (8, 1)
  assert precision.loss_scale(opt) == summary["loss_scale"]
  assert precision.skipped_steps(opt, step) == summary["skipped_steps"] >= 3


def test_resume_needs_a_run_folder(tmp_path):
  with pytest.raises(UserError, match="is not a run folder"):
    train.train_and_evaluate(config.Config(resume=str(tmp_path)))


def test_resume_refuses_changed_flags(tmp_path):
  proc = mpt(f"--resume={tmp_path}", "--batch_size=3", timeout=120)
  assert proc.returncode == 2 and "drop --batch_size" in proc.stderr


def test_concurrent_runs_get_distinct_folders(tmp_path):
  cfg = config.Config(logdir=str(tmp_path), run_name="same")
  made = []
  threads = [threading.Thread(target=lambda: made.append(rundir.create(cfg)))
             for _ in range(16)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len({str(p) for p in made}) == 16
