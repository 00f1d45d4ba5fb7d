"""End to end, in process: both loops x three policies on tiny generated data."""

import json
import pathlib

import pytest

from mpt import train
from mpt.errors import UserError

from conftest import read_events, read_scalars

SUMMARY_KEYS = {
    "policy", "loop", "model", "dataset", "image_size", "batch_size", "epochs", "steps",
    "ms_per_step", "images_per_sec", "train_loss", "train_accuracy", "val_loss",
    "val_accuracy", "loss_scale", "skipped_steps", "compute_dtype", "variable_dtype",
    "tf_version", "device", "wall_s", "status"}
TAGS = {"train/loss", "train/accuracy", "eval/loss", "eval/accuracy"}
DETAILED_TAGS = {"perf/step_time_ms", "perf/data_wait_ms", "perf/images_per_sec",
                 "perf/tflops", "precision/loss_scale", "precision/skipped_steps",
                 "util/process_cpu_percent", "util/system_cpu_percent", "util/rss_mb",
                 "final/ms_per_step", "final/images_per_sec", "final/val_accuracy"}
COMPUTE = {"float32": "float32", "mixed_float16": "float16",
           "mixed_bfloat16": "bfloat16"}


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_train_writes_summary_and_events(tiny, loop, policy):
  summary = train.train_and_evaluate(tiny(loop=loop, policy=policy, log_every=4,
                                          sample_every=0.1))
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
  assert TAGS | DETAILED_TAGS <= set(scalars)
  assert [step for step, _ in scalars["train/loss"]] == [8, 16, 24]
  losses = [value for _, value in scalars["train/loss"]]
  assert losses[-1] < losses[0], losses
  assert losses[-1] == pytest.approx(summary["train_loss"])

  # Instrumentation: every 4 steps, plausible values, the same tags for both loops.
  assert [s for s, _ in scalars["perf/step_time_ms"]] == [4, 8, 12, 16, 20, 24]
  assert all(v > 0 for _, v in scalars["perf/step_time_ms"])
  assert all(0 <= v < 1e4 for _, v in scalars["perf/data_wait_ms"])
  assert all(v > 0 for _, v in scalars["perf/tflops"])
  assert all(v > 0 for _, v in scalars["util/rss_mb"])
  scale = [v for _, v in scalars["precision/loss_scale"]]
  if policy == "mixed_float16":
    assert scale[-1] == summary["loss_scale"]
  else:
    assert set(scale) == {1.0}
  assert scalars["precision/skipped_steps"][-1][1] == summary["skipped_steps"]
  assert scalars["final/ms_per_step"][0][1] == pytest.approx(summary["ms_per_step"])
  times = summary["step_time_ms"]
  assert times["p10"] <= times["median"] <= times["p90"]
  assert 0 <= summary["data_wait_share"] < 1
  assert summary["util"]["rss_mb"]["max"] >= summary["util"]["rss_mb"]["mean"] > 0
  # Every run ends with its diagnosis: files, and the report in TensorBoard.
  diagnosis = json.loads(open(f"{run_dir}/diagnosis.json").read())
  assert diagnosis["kind"] == "run" and diagnosis["figures"]["ms_per_step"] == summary["ms_per_step"]
  assert "diagnosis/report" in read_events(run_dir)
  assert summary["hardware"]["cpu_count"] >= 1 and summary["hardware"]["gpus"] == []
  assert summary["gpu_util_absent"] == "no GPU visible to TensorFlow"
  assert summary["achieved_gflops"] > 0 and summary["flops_per_step"] > 0
  assert 0 < summary["mfu"] < 1.5 and "estimate" in summary["peak_source"]
  dtypes = json.loads(open(f"{run_dir}/dtypes.json").read())
  assert dtypes["policy"] == policy and dtypes["gradients_match_variables"]
  events = read_events(run_dir)
  assert "inspect/dtypes" in events and "precision/policy" in events


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


def test_noinstrument_keeps_metrics_and_timing_only(tiny):
  summary = train.train_and_evaluate(tiny(instrument=False, epochs=1))
  assert summary["ms_per_step"] > 0 and summary["util"] is None
  assert summary["data_wait_share"] is None
  tags = set(read_events(summary["run_dir"]))
  assert TAGS <= tags
  assert not {t for t in tags if t.startswith(("perf/", "util/", "precision/loss"))}
  assert not (pathlib.Path(summary["run_dir"]) / "dtypes.json").exists()


def test_hparams_are_logged_for_the_dashboard(tiny):
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.plugins.hparams import plugin_data_pb2
  summary = train.train_and_evaluate(tiny(epochs=1, steps_per_epoch=2, policy="mixed_bfloat16"))
  acc = event_accumulator.EventAccumulator(summary["run_dir"])
  acc.Reload()
  content = acc.PluginTagToContent("hparams")
  data = plugin_data_pb2.HParamsPluginData.FromString(
      content["_hparams_/session_start_info"])
  hparams = {k: v.string_value or v.number_value or v.bool_value
             for k, v in data.session_start_info.hparams.items()}
  assert hparams["policy"] == "mixed_bfloat16" and hparams["batch_size"] == 8
  assert {"loop", "model", "image_size", "jit_compile", "dataset"} <= set(hparams)
