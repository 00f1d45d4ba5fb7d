"""End to end, in process: both loops x three policies on tiny generated data."""

import json
import pathlib

import pytest

from mpt.train.cli import synthetic
from mpt.errors import UserError
from mpt.machine import isa
from mpt.records import runs
from mpt.records.memory import MemoryPlan
from mpt.records.summary import RunSummary
from mpt.records.verdict import PolicyVerdict

from helpers import mpt_forked, read_events, read_scalars, tiny_flags, train_run

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
  returned = train_run(tiny(loop=loop, policy=policy, log_every=4,
                                           sample_every=0.1))
  run_dir = returned["run_dir"]
  # What other tools read is the file: every check below is on it.
  summary = json.loads(open(f"{run_dir}/summary.json").read())
  assert summary["run_dir"] == run_dir and summary["steps"] == returned["steps"]
  assert SUMMARY_KEYS <= set(summary)
  # Every key the run wrote, at every depth, is a field of the typed record: a field
  # renamed on one side only would be left over here (and read back as a default).
  unknown = []
  record = RunSummary.from_dict(summary, unknown)
  assert unknown == [] and record.to_dict() == summary
  assert isinstance(record.policy_verdict, PolicyVerdict)
  assert isinstance(record.memory, MemoryPlan) and record.memory.peak_rss_mb > 0
  assert record.util.process_cpu_percent.mean > 0 and record.hardware.cpu_count > 0
  assert record.hardware.tf32 is True  # --tf32, the default: TensorFlow's TF32 left on.
  assert summary["status"] == "completed"
  # --numerics=auto (the default): a 16-bit run samples its numerics, float32 does not.
  assert pathlib.Path(run_dir, "numerics.json").exists() == (policy != "float32")
  assert (summary["compute_dtype"], summary["variable_dtype"]) == (COMPUTE[policy],
                                                                   "float32")
  assert summary["steps"] == 3 * 8 and summary["epochs_completed"] == 3
  assert summary["ms_per_step"] > 0 and summary["images_per_sec"] > 0
  # The same warm-up rule in both loops: tiny's first 2 steps are not timed.
  assert summary["timed_steps"] == 24 - 2
  assert summary["ms_per_step"] == summary["step_time_ms"]["median"]
  assert 0.0 <= summary["val_accuracy"] <= 1.0
  if policy == "mixed_float16":
    # A dynamic scale starts at 2**15, halves at each skipped step and doubles only
    # after 2000 good ones: after 24 steps it tells how many were skipped.
    assert summary["loss_scale"] == 2.0**(15 - summary["skipped_steps"])
  else:
    assert summary["loss_scale"] is None and summary["skipped_steps"] == 0

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
  # The CPU facts are the stand-in cpuinfo's (conftest.py); GPUs are hidden.
  cpu = isa.detect()
  assert summary["hardware"]["cpu"] == cpu.name
  assert summary["hardware"]["cpu_flags"] == sorted(k for k, v in cpu.isa().items() if v)
  assert summary["hardware"]["gpus"] == []
  assert summary["gpu_util_absent"] == "no GPU visible to TensorFlow"
  assert summary["achieved_gflops"] > 0 and summary["flops_per_step"] > 0
  peak = isa.peak_gflops(cpu, COMPUTE[policy])
  assert summary["peak_source"] == f"estimate: {peak['assumptions']}"
  if peak["gflops"] is None:  # No clock in the cpuinfo (ARM): no MFU, and it says why.
    assert summary["mfu"] is None and "clock unknown" in summary["peak_source"]
  else:
    assert summary["mfu"] == pytest.approx(summary["achieved_gflops"] / peak["gflops"])
  dtypes = json.loads(open(f"{run_dir}/dtypes.json").read())
  assert dtypes["policy"] == policy and dtypes["gradients_match_variables"]
  events = read_events(run_dir)
  assert "inspect/dtypes" in events and "precision/policy" in events


def test_fit_and_custom_follow_the_same_curve(tiny):
  # Sampled often enough that both runs have utilisation scalars to compare.
  fit = train_run(tiny(loop="fit", epochs=2, sample_every=0.05))
  custom = train_run(tiny(loop="custom", epochs=2, sample_every=0.05))
  a, b = read_scalars(fit["run_dir"]), read_scalars(custom["run_dir"])
  for tag in ("train/loss", "eval/loss", "eval/accuracy"):
    assert [v for _, v in a[tag]] == pytest.approx([v for _, v in b[tag]], rel=1e-4), tag
  # One set of TensorBoard tags for both loops: scalars and texts, none extra.
  fit_events, custom_events = read_events(fit["run_dir"]), read_events(custom["run_dir"])
  assert set(fit_events) == set(custom_events)
  texts = {t for t, v in fit_events.items() if isinstance(v[0][1], str)}
  assert {"run/flags", "precision/policy", "inspect/dtypes", "diagnosis/report"} <= texts
  assert {t for t in fit_events if t not in texts} == set(a) == set(b)


def test_runs_never_overwrite_each_other(tiny):
  first = train_run(tiny(run_name="same", epochs=1, steps_per_epoch=1))
  second = train_run(tiny(run_name="same", epochs=1, steps_per_epoch=1))
  assert first["run_dir"].endswith("/same") and second["run_dir"].endswith("/same-1")
  flags = open(f"{second['run_dir']}/flags.txt").read().split()
  assert "--run_name=same" in flags and "--steps_per_epoch=1" in flags
  # Each run appended its line to the logbook next to the run folders.
  rows = runs.read(pathlib.Path(first["run_dir"]).parent / "runs.csv")
  assert [(r.run_dir, r.status, r.steps) for r in rows] == [
      (first["run_dir"], "completed", 1), (second["run_dir"], "completed", 1)]
  assert rows[1].ms_per_step == second["ms_per_step"] and rows[1].batch_size == 8


def test_unwritable_logdir_fails_before_any_work(tiny, tmp_path):
  """Before the data: a fresh --data_dir is never generated."""
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  with pytest.raises(UserError, match="cannot create --logdir"):
    train_run(tiny(logdir=str(blocker / "logs"), data_dir=str(tmp_path / "d")))
  assert not (tmp_path / "d").exists()


def test_unknown_model_fails_before_any_work(tiny, tmp_path):
  """Before the data and the run folder: neither a fresh --data_dir nor --logdir is
  made."""
  with pytest.raises(UserError, match="unknown --model='resnet9000'"):
    train_run(tiny(model="resnet9000", data_dir=str(tmp_path / "d")))
  assert not (tmp_path / "d").exists() and not (tmp_path / "logs").exists()


def test_noinstrument_keeps_metrics_and_timing_only(tiny):
  summary = train_run(tiny(instrument=False, epochs=1))
  assert summary["ms_per_step"] > 0 and summary["util"] is None
  assert summary["data_wait_share"] is None
  tags = set(read_events(summary["run_dir"]))
  assert TAGS <= tags
  assert not {t for t in tags if t.startswith(("perf/", "util/", "precision/loss"))}
  assert not (pathlib.Path(summary["run_dir"]) / "dtypes.json").exists()


def test_hparams_are_logged_for_the_dashboard(tiny):
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.plugins.hparams import plugin_data_pb2
  summary = train_run(tiny(epochs=1, steps_per_epoch=2, policy="mixed_bfloat16"))
  acc = event_accumulator.EventAccumulator(summary["run_dir"])
  acc.Reload()
  content = acc.PluginTagToContent("hparams")
  data = plugin_data_pb2.HParamsPluginData.FromString(
      content["_hparams_/session_start_info"])
  hparams = {k: v.string_value or v.number_value or v.bool_value
             for k, v in data.session_start_info.hparams.items()}
  assert hparams["policy"] == "mixed_bfloat16" and hparams["batch_size"] == 8
  assert {"loop", "model", "image_size", "jit_compile", "dataset"} <= set(hparams)
  # The experiment: those hparams, and as metrics the final/* scalars and nothing else
  # (undeclared, TensorBoard would make every scalar tag a metric column).
  experiment = plugin_data_pb2.HParamsPluginData.FromString(
      content["_hparams_/experiment"]).experiment
  assert {h.name for h in experiment.hparam_infos} == set(hparams)
  metrics = {m.name.tag for m in experiment.metric_infos}
  assert metrics == {"final/ms_per_step", "final/images_per_sec", "final/val_accuracy"}
  assert metrics == {t for t in read_scalars(summary["run_dir"])
                     if t.startswith("final/")}
  infos = {h.name: h for h in experiment.hparam_infos}
  policies = [v.string_value for v in infos["policy"].domain_discrete.values]
  assert "mixed_bfloat16" in policies
  assert infos["batch_size"].domain_interval.min_value == 1
  # The table's first view: TensorBoard's backend orders a declared experiment's
  # hparams (its own function) and the dashboard ticks the first five (TensorBoard
  # 2.21's hparams query pane, `Math.min(5, ...)`): the ones runs are compared by.
  from tensorboard.plugins.hparams import backend_context
  backend_context._sort_and_reduce_to_hparams_limit(experiment)
  shown = {h.name for h in experiment.hparam_infos[:5]}
  assert {"policy", "loop", "model", "strategy"} <= shown, shown


def test_custom_scalars_put_train_and_eval_on_one_chart_each(tiny):
  import re
  import tensorflow as tf
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.plugins.custom_scalar import layout_pb2
  summary = train_run(tiny(epochs=1, steps_per_epoch=2, instrument=False))
  acc = event_accumulator.EventAccumulator(summary["run_dir"],
                                           size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  assert "custom_scalars__config__" in acc.PluginTagToContent("custom_scalars")
  [event] = acc.Tensors("custom_scalars__config__")
  layout = layout_pb2.Layout.FromString(tf.make_ndarray(event.tensor_proto).item())
  tags = set(read_scalars(summary["run_dir"]))
  charts = {c.title: {t for t in tags if any(re.search(r, t) for r in c.multiline.tag)}
            for category in layout.category for c in category.chart}
  assert charts == {"loss": {"train/loss", "eval/loss"},
                    "accuracy": {"train/accuracy", "eval/accuracy"}}


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_jit_compile_runs_the_step_through_xla(tmp_path, loop):
  """XLA dumps each module it compiles: one must be the train step, told from the
  eval step by its backward pass (the seed convnet's 3 convolutions, then the
  gradients' 6; an eval step has the 3 alone)."""
  dump = tmp_path / "xla"
  # Forked from the TF-importing server: XLA reads XLA_FLAGS at its first compile.
  proc = mpt_forked(*tiny_flags(tmp_path, "--jit_compile", f"--loop={loop}",
                                "--epochs=1", "--steps_per_epoch=2", "--run_name=xla"),
                    env={"XLA_FLAGS": f"--xla_dump_to={dump}"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  convolutions = sorted(p.read_text().count(" convolution(")
                        for p in dump.glob("*before_optimizations.txt"))
  assert convolutions and convolutions[-1] == 9, convolutions  # The train step.
  assert convolutions[0] == 3, convolutions  # And the eval step.
  summary = json.loads((tmp_path / "logs" / "xla" / "summary.json").read_text())
  assert summary["status"] == "completed" and summary["jit_compile"] is True


def test_a_folder_dataset_trains_end_to_end_and_counts_skipped_files(tiny, tmp_path):
  root = synthetic.generate(tmp_path / "imagenette", 30, 20, 40, seed=1)
  victim = sorted((root / "train").rglob("*.JPEG"))[0]
  victim.write_bytes(victim.read_bytes()[:50])  # A truncated download.
  (root / "val" / "n01440764" / "README.txt").write_text("not an image")
  summary = train_run(tiny(dataset=f"folder:{root}", batch_size=4,
                                          epochs=2, data_dir=""))
  assert summary["status"] == "completed" and summary["data_source"].startswith("folder")
  assert (summary["n_train"], summary["n_val"]) == (29, 20)
  assert summary["skipped_files"] == 1
  assert summary["skipped_file_names"] == [str(victim)]
  assert summary["steps"] == 2 * summary["steps_per_epoch"] == 2 * 8  # ceil(29 / 4)
