"""End to end, in process: both loops x three policies on tiny generated data."""

import json

import pytest

from mpt import train
from mpt.errors import UserError

from conftest import read_scalars

SUMMARY_KEYS = {
    "policy", "loop", "model", "dataset", "image_size", "batch_size", "epochs", "steps",
    "ms_per_step", "images_per_sec", "train_loss", "train_accuracy", "val_loss",
    "val_accuracy", "loss_scale", "skipped_steps", "compute_dtype", "variable_dtype",
    "tf_version", "device", "wall_s", "status"}
TAGS = {"train/loss", "train/accuracy", "eval/loss", "eval/accuracy",
        "perf/step_time_ms", "perf/images_per_sec"}
COMPUTE = {"float32": "float32", "mixed_float16": "float16",
           "mixed_bfloat16": "bfloat16"}


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_train_writes_summary_and_events(tiny, loop, policy):
  summary = train.train_and_evaluate(tiny(loop=loop, policy=policy))
  assert SUMMARY_KEYS <= set(summary)
  assert summary["status"] == "completed"
  assert (summary["compute_dtype"], summary["variable_dtype"]) == (COMPUTE[policy],
                                                                   "float32")
  assert summary["steps"] == 3 * 8 and summary["epochs_completed"] == 3
  assert summary["ms_per_step"] > 0 and summary["images_per_sec"] > 0
  assert 0.0 <= summary["val_accuracy"] <= 1.0
  if policy == "mixed_float16":
    assert 0 < summary["loss_scale"] <= 2.0**15 and summary["skipped_steps"] >= 0
  else:
    assert summary["loss_scale"] is None and summary["skipped_steps"] == 0

  run_dir = summary["run_dir"]
  on_disk = json.loads(open(f"{run_dir}/summary.json").read())
  assert on_disk == json.loads(json.dumps(summary))
  scalars = read_scalars(run_dir)
  assert TAGS <= set(scalars)
  assert [step for step, _ in scalars["train/loss"]] == [8, 16, 24]
  losses = [value for _, value in scalars["train/loss"]]
  assert losses[-1] < losses[0], losses
  assert losses[-1] == pytest.approx(summary["train_loss"])


def test_fit_and_custom_follow_the_same_curve(tiny):
  fit = train.train_and_evaluate(tiny(loop="fit", epochs=2))
  custom = train.train_and_evaluate(tiny(loop="custom", epochs=2))
  a, b = read_scalars(fit["run_dir"]), read_scalars(custom["run_dir"])
  for tag in ("train/loss", "eval/loss", "eval/accuracy"):
    assert [v for _, v in a[tag]] == pytest.approx([v for _, v in b[tag]], rel=1e-4), tag


def test_runs_never_overwrite_each_other(tiny):
  first = train.train_and_evaluate(tiny(run_name="same", epochs=1, steps_per_epoch=1))
  second = train.train_and_evaluate(tiny(run_name="same", epochs=1, steps_per_epoch=1))
  assert first["run_dir"].endswith("/same") and second["run_dir"].endswith("/same-1")
  flags = open(f"{second['run_dir']}/flags.txt").read().split()
  assert "--run_name=same" in flags and "--steps_per_epoch=1" in flags


def test_unwritable_logdir_fails_before_any_work(tiny, tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  with pytest.raises(UserError, match="cannot create --logdir"):
    train.train_and_evaluate(tiny(logdir=str(blocker / "logs")))


def test_unknown_model_fails_before_any_work(tiny):
  with pytest.raises(UserError, match="unknown --model='resnet9000'"):
    train.train_and_evaluate(tiny(model="resnet9000"))
