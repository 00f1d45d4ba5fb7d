"""Checkpoints: fallback past a damaged one, determinism, the loss scale, run folders.
(Kill-and-resume equivalence: test_resume.py.)"""

import pathlib
import threading

import pytest

from mpt.train.cli import checkpoint
from mpt import config
from mpt import models
from mpt.train.common import precision
from mpt.records import rundir
from mpt.train.cli import run as train
from mpt.errors import UserError

from helpers import mpt, read_scalars

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


def test_two_deterministic_runs_give_identical_losses(tiny):
  from tensorflow.python.framework import config as tf_config  # No public getter.
  assert not tf_config.is_op_determinism_enabled()  # conftest.py turns it off.
  first = train.train_and_evaluate(tiny(deterministic=True, loop="fit"))
  # The control: the flag did turn TensorFlow's op determinism on (two seeded CPU
  # runs are usually identical without it), and the run says so.
  assert tf_config.is_op_determinism_enabled() and first["deterministic"] is True
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
