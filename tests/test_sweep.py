"""Sweeps: a tiny sweep end to end (child processes), OOM and timeout cells, resuming,
Ctrl-C, bad lists, and the seed-style table for a known CSV (golden)."""

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mpt import config
from mpt import sweep
from mpt import sweep_report
from mpt.errors import UserError

from conftest import ROOT, read_events

TINY = dict(mode="sweep", image_size=16, synthetic_train=20, synthetic_val=10,
            synthetic_px=20, epochs=1, steps_per_epoch=3, warmup_steps=1)


def tiny_sweep(tmp_path, **overrides) -> config.Config:
  return config.Config(**{**TINY, "data_dir": str(tmp_path / "data"),
                          "logdir": str(tmp_path / "logs"), **overrides})


def test_tiny_sweep_with_an_oom_cell_then_resume(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("MPT_TEST_OOM_BATCH", "8")  # The children inherit it.
  cfg = tiny_sweep(tmp_path, batch_sizes="4,8", policies="float32,mixed_bfloat16")
  result = sweep.run(cfg)
  assert result["status"] == "completed" and result["cells"] == 4
  out = sweep.sweep_dir(cfg)
  rows = sweep_report.read_csv(out / "sweep.csv")
  assert [(r["batch_size"], r["policy"], r["status"]) for r in rows] == [
      ("4", "float32", "ok"), ("4", "mixed_bfloat16", "ok"),
      ("8", "float32", "OOM"), ("8", "mixed_bfloat16", "OOM")]
  assert all(float(r["ms_per_step"]) > 0 for r in rows[:2])
  assert "ResourceExhaustedError: OOM when allocating" in rows[2]["error"]
  assert rows[0]["tf_version"] and "avx" in rows[0]["cpu_isa"]
  table = (out / "sweep.md").read_text()
  assert "| 8 | OOM | OOM | - |" in table and "mixed_bfloat16 vs float32" in table
  assert (out / "sweep.png").stat().st_size > 0
  # Every finished cell is an HParams run under cells/.
  assert "final/ms_per_step" in read_events(rows[0]["run_dir"])
  assert "| 8 | OOM | OOM | - |" in capsys.readouterr().out  # printed at the end

  # The same command again: nothing left to run; the table is the same.
  monkeypatch.delenv("MPT_TEST_OOM_BATCH")
  assert sweep.run(cfg)["status"] == "completed"
  assert "(4 already finished)" in capsys.readouterr().out
  assert len(sweep_report.read_csv(out / "sweep.csv")) == 4
  assert (out / "sweep.md").read_text() == table


def test_a_cell_past_its_timeout_is_recorded_and_the_sweep_goes_on(tmp_path):
  cfg = tiny_sweep(tmp_path, batch_sizes="4", cell_timeout=0.5)
  sweep.run(cfg)
  [row] = sweep_report.read_csv(sweep.sweep_dir(cfg) / "sweep.csv")
  assert row["status"] == "timeout" and row["error"] == "killed after 0.5 s"
  assert "| 4 | timeout |" in (sweep.sweep_dir(cfg) / "sweep.md").read_text()


def test_force_reruns_finished_cells(tmp_path, monkeypatch):
  cfg = tiny_sweep(tmp_path, batch_sizes="4", run_name="s")
  out = sweep.sweep_dir(cfg)
  out.mkdir(parents=True)
  cell = sweep.cells(cfg)[0]
  sweep_report.append_csv(out / "sweep.csv", {**cell, "status": "OOM", "error": "x"})
  ran = []
  monkeypatch.setattr(sweep, "run_cell",
                      lambda cfg, cell, out, timeout: ran.append(cell) or
                      {**cell, "status": "OOM", "error": "again"})
  sweep.run(cfg)
  assert ran == []  # finished: skipped
  sweep.run(config.Config(**{**cfg.__dict__, "force": True}))
  assert ran == [cell]


def test_ctrl_c_stops_the_running_cell_and_prints_the_partial_table(tmp_path):
  proc = subprocess.Popen(
      [sys.executable, "-m", "mpt.main", "--mode=sweep", "--batch_sizes=4,5",
       "--image_size=16", "--synthetic_train=20", "--synthetic_val=10",
       "--synthetic_px=20", "--epochs=1000", "--steps_per_epoch=2", "--run_name=s",
       f"--data_dir={tmp_path}/data", f"--logdir={tmp_path}/logs"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True,
      # Started as `&` in a script starts it (and as CI runners may): SIGINT ignored.
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
  events = tmp_path / "logs" / "s" / "cells" / "seed_convnet_16px_b4_float32_fit"
  deadline = time.time() + 180
  while time.time() < deadline and "train/loss" not in (
      read_events(events) if events.exists() else {}):
    time.sleep(0.3)
  proc.send_signal(signal.SIGINT)  # As Ctrl-C in a terminal does (to the sweep).
  try:
    out, err = proc.communicate(timeout=240)
  except subprocess.TimeoutExpired:  # Say where it hung, then fail.
    os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate()
    pytest.fail(f"the sweep did not stop after SIGINT:\n{out[-2000:]}\n{err[-3000:]}")
  assert proc.returncode == 130, err[-2000:]
  assert "sweep interrupted" in out and "| 4 | interrupted |" in out
  summary = json.loads((events / "summary.json").read_text())
  assert summary["status"] == "interrupted"  # The child was stopped, not killed.
  assert not (tmp_path / "logs" / "s" / "cells" / "seed_convnet_16px_b5_float32_fit").exists()


@pytest.mark.parametrize("overrides,words", [
    (dict(batch_sizes="4,4"), "--batch_sizes='4,4' lists a value twice"),
    (dict(batch_sizes="4,x"), "--batch_sizes='4,x' must list whole numbers"),
    (dict(batch_sizes="4,,8"), "has an empty item"),
    (dict(batch_sizes="4,64"), "64 is larger than the training set (20 images)"),
    (dict(batch_sizes="0"), "--batch_sizes: --batch_size must be >= 1"),
    (dict(policies="float32,fp8"), "--policies: unknown --policy='fp8'"),
    (dict(loops="fit,keras"), "--loops: unknown --loop='keras'"),
    (dict(jit_compiles="false,maybe"), "--jit_compiles='false,maybe' must list true/false"),
])
def test_bad_lists_fail_before_any_cell(tmp_path, overrides, words):
  with pytest.raises(UserError) as e:
    sweep.run(tiny_sweep(tmp_path, **overrides))
  assert words in str(e.value)
  assert not (tmp_path / "logs").exists()


KNOWN_CSV = """model,image_size,batch_size,policy,loop,jit_compile,status,ms_per_step,images_per_sec,error
seed_convnet,64,32,float32,fit,False,ok,200.0,160.0,
seed_convnet,64,32,mixed_bfloat16,fit,False,ok,2500.0,12.8,
seed_convnet,64,32,float32,custom,False,ok,190.0,168.4,
seed_convnet,64,32,mixed_bfloat16,custom,False,ok,2400.0,13.3,
seed_convnet,64,64,float32,fit,False,ok,380.0,168.4,
seed_convnet,64,64,mixed_bfloat16,fit,False,OOM,,,OOM when allocating
seed_convnet,64,64,float32,custom,False,timeout,,,killed after 300 s
seed_convnet,64,64,mixed_bfloat16,custom,False,ok,4600.0,13.9,
"""

GOLDEN = """## seed_convnet, 64 px: ms/step

| batch | float32 fit | mixed_bfloat16 fit | float32 custom | mixed_bfloat16 custom | mixed_bfloat16 fit vs float32 | mixed_bfloat16 custom vs float32 |
|---|---|---|---|---|---|---|
| 32 | 200.0 | 2500.0 | 190.0 | 2400.0 | 0.08x | 0.08x |
| 64 | 380.0 | OOM | timeout | 4600.0 | - | - |
"""


def test_markdown_table_for_a_known_csv_matches_golden():
  rows = list(csv.DictReader(io.StringIO(KNOWN_CSV)))
  assert sweep_report.markdown(rows) == GOLDEN


def test_without_matplotlib_the_plot_is_skipped_and_says_so(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  rows = list(csv.DictReader(io.StringIO(KNOWN_CSV)))
  message = sweep_report.plot(rows, tmp_path / "sweep.png")
  assert message.startswith("plot skipped: matplotlib is not installed")
  assert not (tmp_path / "sweep.png").exists()
