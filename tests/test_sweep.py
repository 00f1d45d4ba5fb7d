"""Sweeps: a tiny sweep end to end (child processes), OOM and timeout cells, resuming,
Ctrl-C, bad lists, and the seed-style table for a known CSV (golden)."""

import csv
import io
import json
import os
import signal
import subprocess
import sys

import pytest

from mpt import config
from mpt import sweep
from mpt import sweep_report
from mpt.errors import UserError
from mpt.microbench import isa

from helpers import TINY_FLAGS, read_events, wait_for

TINY = dict(mode="sweep", image_size=16, synthetic_train=20, synthetic_val=10,
            synthetic_px=20, epochs=1, steps_per_epoch=3, warmup_steps=1)


def tiny_sweep(tmp_path, **overrides) -> config.Config:
  return config.Config(**{**TINY, "data_dir": str(tmp_path / "data"),
                          "logdir": str(tmp_path / "logs"), **overrides})


@pytest.mark.slow
def test_every_way_a_cell_ends_then_a_resume_reruns_only_the_failed(tmp_path,
                                                                   monkeypatch, capsys):
  # One cell of each ending, in children that inherit the injected faults: float32 at
  # batch 8 runs out of memory, mixed_bfloat16 at 8 is SIGKILLed (as the kernel's OOM
  # killer does), mixed_bfloat16 at 4 fails (a bug); float32 at 4 runs.
  monkeypatch.setenv("MPT_INJECT_FAULT",
                     "oom:8/float32,kill:8/mixed_bfloat16,fail:4/mixed_bfloat16")
  cfg = tiny_sweep(tmp_path, batch_sizes="4,8", policies="float32,mixed_bfloat16")
  result = sweep.run(cfg)
  assert result["status"] == "completed" and result["cells"] == 4
  out = sweep.sweep_dir(cfg)
  rows = sweep_report.read_csv(out / "sweep.csv")
  assert [(r["batch_size"], r["policy"], r["status"]) for r in rows] == [
      ("4", "float32", "ok"), ("4", "mixed_bfloat16", "failed"),
      ("8", "float32", "OOM"), ("8", "mixed_bfloat16", "OOM")]
  assert float(rows[0]["ms_per_step"]) > 0
  assert rows[1]["error"] == ("RuntimeError: injected failure "
                              "(MPT_INJECT_FAULT=fail:4/mixed_bfloat16)")
  assert "ResourceExhaustedError: OOM when allocating" in rows[2]["error"]
  assert rows[3]["error"] == "killed (SIGKILL)"
  cpu = isa.detect()  # The stand-in cpuinfo of the test session (conftest.py).
  assert rows[0]["tf_version"] and rows[0]["cpu"] == cpu.name
  assert rows[0]["cpu_isa"].split() == [k for k, v in cpu.isa().items() if v]
  table = (out / "sweep.md").read_text()
  assert "| 4 | " in table and "| 8 | OOM | OOM | - |" in table
  assert "mixed_bfloat16 vs float32" in table
  assert (out / "sweep.png").stat().st_size > 0
  # Every finished cell is an HParams run under cells/.
  assert "final/ms_per_step" in read_events(rows[0]["run_dir"])
  assert "| 8 | OOM | OOM | - |" in capsys.readouterr().out  # printed at the end
  failed_cell = out / "cells" / "seed_convnet_16px_b4_mixed_bfloat16_fit"
  (failed_cell / "left_by_the_failed_run").write_text("")

  # The same command again: the ok and OOM cells are finished; the failed one runs
  # again, in a clean folder; the table then has all four.
  monkeypatch.delenv("MPT_INJECT_FAULT")
  assert sweep.run(cfg)["status"] == "completed"
  printed = capsys.readouterr().out
  assert "(3 already finished)" in printed
  assert [l.split(" ...")[0] for l in printed.splitlines() if l.startswith("mpt: cell ")] == [
      "mpt: cell 2/4 seed_convnet_16px_b4_mixed_bfloat16_fit"]
  assert not (failed_cell / "left_by_the_failed_run").exists()
  assert json.loads((failed_cell / "summary.json").read_text())["status"] == "completed"
  # The CSV keeps both attempts; readers see the newest row of each cell.
  assert len((out / "sweep.csv").read_text().splitlines()) == 1 + 5
  rerun = sweep_report.read_csv(out / "sweep.csv")
  assert [(r["batch_size"], r["policy"], r["status"]) for r in rerun] == [
      ("4", "float32", "ok"), ("4", "mixed_bfloat16", "ok"),
      ("8", "float32", "OOM"), ("8", "mixed_bfloat16", "OOM")]
  table = (out / "sweep.md").read_text()
  assert "| 8 | OOM | OOM | - |" in table and "failed" not in table
  diagnosis = json.loads((out / "diagnosis.json").read_text())
  assert [c["status"] for c in diagnosis["cells"]] == ["ok", "ok", "OOM", "OOM"]


@pytest.mark.slow
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


@pytest.mark.slow
def test_ctrl_c_stops_the_running_cell_and_prints_the_partial_table(tmp_path, children):
  proc = children.start(
      [sys.executable, "-m", "mpt.main", "--mode=sweep", "--batch_sizes=4,5",
       *[f for f in TINY_FLAGS if not f.startswith("--batch_size=")],
       "--epochs=1000", "--steps_per_epoch=2", "--run_name=s",
       f"--data_dir={tmp_path}/data", f"--logdir={tmp_path}/logs"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      # Started as `&` in a script starts it (and as CI runners may): SIGINT ignored.
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
  events = tmp_path / "logs" / "s" / "cells" / "seed_convnet_16px_b4_float32_fit"
  assert wait_for(lambda: events.exists() and "train/loss" in read_events(events), 180)
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

  # Resumed (short epochs this time, so that it ends): the interrupted cell runs again
  # and the one never started runs; the CSV ends with both done.
  result = sweep.run(tiny_sweep(tmp_path, batch_sizes="4,5", run_name="s"))
  assert result["status"] == "completed"
  rows = sweep_report.read_csv(tmp_path / "logs" / "s" / "sweep.csv")
  assert [(r["batch_size"], r["status"]) for r in rows] == [("4", "ok"), ("5", "ok")]
  assert json.loads((events / "summary.json").read_text())["status"] == "completed"


@pytest.mark.parametrize("spec", ["oom", "oom:x", "melt:4", "kill:4,oops"])
def test_a_malformed_fault_injection_stops_the_sweep_before_any_cell(tmp_path,
                                                                     monkeypatch, spec):
  monkeypatch.setenv("MPT_INJECT_FAULT", spec)
  with pytest.raises(UserError, match="is not KIND:N\\[/POLICY\\] with KIND oom, kill or fail"):
    sweep.run(tiny_sweep(tmp_path, batch_sizes="4"))
  assert not (tmp_path / "logs").exists()


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
