"""Profiler window: traces land in the run folder and the profile plugin serves them."""

import gzip
import json
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from mpt import train
from mpt.errors import UserError


@pytest.mark.parametrize("spec,words", [
    ("5,3", "reversed"),
    ("2,4", "after the 2 warm-up steps"),
    ("20,30", "the run has only 24 steps"),
    ("x", "must be two step numbers"),
])
def test_bad_windows_fail_before_training(tiny, spec, words):
  cfg = tiny(profile_steps=spec)
  with pytest.raises(UserError, match=words):
    train.train_and_evaluate(cfg)
  assert not pathlib.Path(cfg.logdir).exists() or not any(pathlib.Path(cfg.logdir).iterdir())


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_window_writes_an_xplane_trace(tiny, loop):
  summary = train.train_and_evaluate(tiny(loop=loop, epochs=1, profile_steps="4,6"))
  traces = list(pathlib.Path(summary["run_dir"]).glob("plugins/profile/*/*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 1000
  # The run's diagnosis read the trace with the profile plugin's converter.
  stats = json.loads((pathlib.Path(summary["run_dir"]) / "op_stats.json").read_text())
  types = {o["type"] for o in stats["top_ops"]}
  assert stats["rows"] == "Host" and stats["op_time_ms"] > 0
  assert types & {"Conv2D", "_FusedConv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput"}
  assert {"conv1", "conv2", "conv3"} <= set(stats["layer_time_share"])
  assert sum(stats["layer_time_share"].values()) <= 1.0 + 1e-9


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_tensorboard_profile_plugin_lists_the_run(tiny, tmp_path):
  summary = train.train_and_evaluate(tiny(loop="custom", epochs=1, profile_steps="3,4",
                                          run_name="profiled"))
  port = _free_port()
  tb = subprocess.Popen(
      [sys.executable, "-m", "tensorboard.main", f"--logdir={pathlib.Path(summary['run_dir']).parent}",
       "--host=127.0.0.1", f"--port={port}"],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    runs, deadline = None, time.time() + 90
    while time.time() < deadline:
      try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/data/plugin/profile/runs", timeout=5) as r:
          body = r.read()
          if r.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
          runs = json.loads(body)
        if runs:
          break
      except OSError:
        pass
      time.sleep(1)
    assert runs and any(run.startswith("profiled") for run in runs), runs
  finally:
    tb.terminate()
    tb.wait(timeout=30)
