"""The profiler window (mpt/measure/profiler.py): which steps a run traces, the trace in
the run folder, read by the diagnosis, and served by TensorBoard's profile plugin.
The op statistics' own rules on hand-made rows: tests/diagnose/test_opstats.py."""

import gzip
import json
import pathlib
import re
import subprocess
import sys
import urllib.request

import pytest

from mpt.diagnose import opstats
from mpt.errors import UserError
from mpt.measure import profiler
from mpt.train.common.plan import Plan

from helpers import trace_steps, train_run, wait_for

CONV = {"Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput"}


@pytest.mark.parametrize("spec,words", [
    ("5,3", "reversed"),
    ("2,4", "after the 2 warm-up steps"),
    ("20,30", "the run has only 24 steps"),
    ("x", "must be two step numbers"),
])
def test_bad_windows_fail_before_training(tiny, spec, words):
  cfg = tiny(profile_steps=spec)
  with pytest.raises(UserError, match=words):
    train_run(cfg)
  assert not pathlib.Path(cfg.logdir).exists() or not any(pathlib.Path(cfg.logdir).iterdir())


@pytest.mark.parametrize("spec,gpu,total,window", [
    ("", True, 24, (3, 4)),      # A GPU run is profiled by default, after the warm-up.
    ("", True, 3, None),         # ... where it has those steps.
    ("", False, 24, None),       # A CPU run only when asked.
    ("off", True, 24, None),     # Turned off.
    ("5,6", True, 24, (5, 6)),   # Asked for: as asked.
])
def test_the_default_window_profiles_gpu_runs_only(spec, gpu, total, window):
  profile = Plan(profile_steps=spec, warmup_steps=2).profile
  assert profiler.window(profile, 2, total, gpu=gpu) == window


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_window_writes_an_xplane_trace(tiny, loop):
  summary = train_run(tiny(loop=loop, epochs=1, profile_steps="4,6"))
  traces = list(pathlib.Path(summary["run_dir"]).glob("plugins/profile/*/*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 1000
  # Each traced step is marked as the profile plugin's step view groups it.
  assert trace_steps(traces[0]) == [("train", {"step_num": n, "_r": 1}) for n in (4, 5, 6)]
  # The run's diagnosis read the trace with the profile plugin's converter.
  stats = json.loads((pathlib.Path(summary["run_dir"]) / "op_stats.json").read_text())
  assert stats["rows"] == "Host" and stats["op_time_ms"] > 0
  assert all(o["kernels"] for o in stats["top_ops"])
  # Whatever this CPU's kernels are called, the three convolutions are found (in the
  # whole table: on a fast CPU, tiny convolutions may fall out of the top ten).
  rows = opstats.framework_op_stats(traces[0])
  kernels = {r["type"] for r in rows if r["host_or_device"] == "Host"}
  assert CONV <= {opstats.canonical_type(k) for k in kernels}, kernels
  assert {"conv1", "conv2", "conv3"} <= set(stats["layer_time_share"])
  assert sum(stats["layer_time_share"].values()) <= 1.0 + 1e-9


def _serving_port(log: pathlib.Path) -> int | None:
  """The port TensorBoard says it serves on; None until it says so."""
  said = re.search(r"TensorBoard \S+ at http://127\.0\.0\.1:(\d+)/", log.read_text())
  return int(said.group(1)) if said else None


def _profile_runs(port: int) -> list[str]:
  """The runs TensorBoard's profile plugin lists; [] while the server is not up yet."""
  try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/profile/runs",
                                timeout=5) as r:
      body = r.read()
      if r.headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
      return json.loads(body)
  except OSError:
    return []


def test_tensorboard_profile_plugin_lists_the_run(tiny, children, tmp_path):
  summary = train_run(tiny(loop="custom", epochs=1, profile_steps="3,4",
                           run_name="profiled"))
  # Port 0: the server binds a free port itself (one picked here first could be
  # taken by another process before the server binds it).
  log = tmp_path / "tensorboard.log"
  with open(log, "w") as err:
    children.start(
        [sys.executable, "-m", "tensorboard.main",
         f"--logdir={pathlib.Path(summary['run_dir']).parent}", "--host=127.0.0.1",
         "--port=0"], stdout=subprocess.DEVNULL, stderr=err)
  assert wait_for(lambda: _serving_port(log), timeout=90, every=1), log.read_text()
  port = _serving_port(log)
  listed = []
  wait_for(lambda: listed.extend(_profile_runs(port)) or bool(listed), timeout=90, every=1)
  assert any(run.startswith("profiled") for run in listed), listed
