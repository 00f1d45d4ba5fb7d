"""Sweeps: a tiny sweep end to end (child processes), OOM and timeout cells, resuming,
Ctrl-C and the other stop signals, bad lists, the sweep folder's name, sweep.csv's
rows, and the seed-style table for a known CSV (golden)."""

import csv
import dataclasses
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import types

import pytest

from mpt import config
from mpt import main
from mpt.diagnose import diagnosis as diagnose
from mpt.diagnose import sweep as diagnose_sweep
from mpt.errors import UserError
from mpt.machine import isa
from mpt.records import cells
from mpt.records import summary as summary_lib
from mpt.records.cells import Cell
from mpt.records.machine import Stat, Utilisation
from mpt.records.memory import Estimate, Line, MemoryPlan
from mpt.sweep import report as sweep_report
from mpt.sweep import cell as sweep_cell
from mpt.sweep import run as sweep
from mpt.sweep.options import SweepOptions

from helpers import TINY_FLAGS, read_events, wait_for

TINY = dict(image_size=16, synthetic_train=20, synthetic_val=10,
            synthetic_px=20, epochs=1, steps_per_epoch=3, warmup_steps=1)
SWEEP_FLAGS = {f.name for f in dataclasses.fields(SweepOptions)}


def session_hparams(run_dir) -> dict:
  """The hparams of a run's HParams session (the `session_start_info` TensorBoard's
  HParams dashboard reads), as in tests/train/cli/test_train.py."""
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.plugins.hparams import plugin_data_pb2
  acc = event_accumulator.EventAccumulator(str(run_dir))
  acc.Reload()
  data = plugin_data_pb2.HParamsPluginData.FromString(
      acc.PluginTagToContent("hparams")["_hparams_/session_start_info"])
  return {k: v.string_value or v.number_value or v.bool_value
          for k, v in data.session_start_info.hparams.items()}


def cell_hparams(run_dir) -> tuple:
  """(model, image size, batch size, policy, loop, XLA) of a cell's HParams session."""
  found = session_hparams(run_dir)
  return tuple(found[k] for k in ("model", "image_size", "batch_size", "policy", "loop",
                                  "jit_compile"))


def tiny_sweep(tmp_path, **overrides) -> tuple[config.Config, SweepOptions]:
  """The tiny run's Config and the sweep's options; each override goes to its own."""
  opts = SweepOptions(**{k: v for k, v in overrides.items() if k in SWEEP_FLAGS})
  cfg = config.Config(**{**TINY, "data_dir": str(tmp_path / "data"),
                         "logdir": str(tmp_path / "logs"),
                         **{k: v for k, v in overrides.items() if k not in SWEEP_FLAGS}})
  return cfg, opts


@pytest.mark.slow
def test_every_way_a_cell_ends_then_a_resume_reruns_only_the_failed(tmp_path,
                                                                   monkeypatch, capsys):
  # One cell of each ending, in children that inherit the injected faults: float32 at
  # batch 8 runs out of memory, mixed_bfloat16 at 8 is SIGKILLed (as the kernel's OOM
  # killer does, counted in the session's stand-in counters), mixed_bfloat16 at 4
  # fails (a bug); float32 at 4 runs.
  monkeypatch.setenv("MPT_INJECT_FAULT",
                     "oom:8/float32,kill:8/mixed_bfloat16,fail:4/mixed_bfloat16")
  cfg, opts = tiny_sweep(tmp_path, batch_sizes="4,8", policies="float32,mixed_bfloat16")
  result = sweep.run(cfg, opts, after_run=diagnose.after_run)
  assert result["status"] == "completed" and result["cells"] == 4
  out = sweep.sweep_dir(cfg, opts)
  rows = cells.read_csv(out / "sweep.csv")
  assert [(r.batch_size, r.policy, r.status) for r in rows] == [
      (4, "float32", "ok"), (4, "mixed_bfloat16", "failed"),
      (8, "float32", "OOM"), (8, "mixed_bfloat16", "OOM")]
  assert rows[0].ms_per_step > 0
  assert rows[1].error == ("RuntimeError: injected failure "
                           "(MPT_INJECT_FAULT=fail:4/mixed_bfloat16)")
  # The cells' own last words: the run's (TF's ResourceExhaustedError caught) and the
  # watching parent's (a SIGKILL).
  assert rows[2].error.startswith("mpt: out of memory at step 1: OOM when allocating")
  assert rows[3].error.startswith("the training process died of SIGKILL while "
                                  "training: the kernel counted an OOM kill")
  # Cells that failed make the sweep's exit status non-zero (OOM is a result).
  assert result["cells_not_completed"] == 1 and main.exit_status(result) == 6
  cpu = isa.detect()  # The stand-in cpuinfo of the test session (conftest.py).
  assert rows[0].tf_version and rows[0].cpu == cpu.name
  assert rows[0].cpu_isa.split() == [k for k, v in cpu.isa().items() if v]
  table = (out / "sweep.md").read_text()
  assert "| 4 | " in table and "| 8 | OOM | OOM | - |" in table
  assert "mixed_bfloat16 time vs float32" in table
  assert (out / "sweep.png").stat().st_size > 0
  # Every finished cell is an HParams run under cells/, its session the cell's values.
  assert "final/ms_per_step" in read_events(rows[0].run_dir)
  assert cell_hparams(rows[0].run_dir) == ("seed_convnet", 16, 4, "float32", "fit", False)
  assert "| 8 | OOM | OOM | - |" in capsys.readouterr().out  # printed at the end
  failed_cell = out / "cells" / "seed_convnet_16px_b4_mixed_bfloat16_fit"
  (failed_cell / "left_by_the_failed_run").write_text("")

  # The same command again: the ok and OOM cells are finished; the failed one runs
  # again, in a clean folder; the table then has all four.
  monkeypatch.delenv("MPT_INJECT_FAULT")
  assert sweep.run(cfg, opts, after_run=diagnose.after_run)["status"] == "completed"
  printed = capsys.readouterr().out
  assert "(3 already finished)" in printed
  assert [l.split(" ...")[0] for l in printed.splitlines() if l.startswith("mpt: cell ")] == [
      "mpt: cell 2/4 seed_convnet_16px_b4_mixed_bfloat16_fit"]
  assert not (failed_cell / "left_by_the_failed_run").exists()
  assert json.loads((failed_cell / "summary.json").read_text())["status"] == "completed"
  # The CSV keeps both attempts; readers see the newest row of each cell.
  assert len((out / "sweep.csv").read_text().splitlines()) == 1 + 5
  rerun = cells.read_csv(out / "sweep.csv")
  assert [(r.batch_size, r.policy, r.status) for r in rerun] == [
      (4, "float32", "ok"), (4, "mixed_bfloat16", "ok"),
      (8, "float32", "OOM"), (8, "mixed_bfloat16", "OOM")]
  table = (out / "sweep.md").read_text()
  assert "| 8 | OOM | OOM | - |" in table and "failed" not in table
  diagnosis = json.loads((out / "diagnosis.json").read_text())
  assert [c["status"] for c in diagnosis["cells"]] == ["ok", "ok", "OOM", "OOM"]
  assert cell_hparams(failed_cell) == (  # Beside the first: the dashboard's two rows.
      "seed_convnet", 16, 4, "mixed_bfloat16", "fit", False)


@pytest.mark.slow
def test_a_cell_past_its_timeout_is_recorded_and_the_sweep_goes_on(tmp_path):
  cfg, opts = tiny_sweep(tmp_path, batch_sizes="4", cell_timeout=0.5)
  sweep.run(cfg, opts)
  [row] = cells.read_csv(sweep.sweep_dir(cfg, opts) / "sweep.csv")
  assert row.status == "timeout" and row.error == "killed after 0.5 s"
  assert "| 4 | timeout |" in (sweep.sweep_dir(cfg, opts) / "sweep.md").read_text()


def test_force_reruns_finished_cells(tmp_path, monkeypatch):
  cfg, opts = tiny_sweep(tmp_path, batch_sizes="4", run_name="s")
  out = sweep.sweep_dir(cfg, opts)
  out.mkdir(parents=True)
  cell = sweep.cells(cfg, opts)[0]
  cells.append_csv(out / "sweep.csv", dataclasses.replace(cell, status="OOM", error="x"))
  ran = []
  monkeypatch.setattr(sweep, "run_cell",
                      lambda cfg, cell, out, timeout: ran.append(cell) or
                      dataclasses.replace(cell, status="OOM", error="again"))
  sweep.run(cfg, opts)
  assert ran == []  # finished: skipped
  sweep.run(dataclasses.replace(cfg, force=True), opts)
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
  result = sweep.run(*tiny_sweep(tmp_path, batch_sizes="4,5", run_name="s"))
  assert result["status"] == "completed"
  rows = cells.read_csv(tmp_path / "logs" / "s" / "sweep.csv")
  assert [(r.batch_size, r.status) for r in rows] == [(4, "ok"), (5, "ok")]
  assert json.loads((events / "summary.json").read_text())["status"] == "completed"


# A cell's child as the sweep sees it, standing in for a run (whose own handling of
# each signal tests/test_exits.py checks): it stops on a stop signal, saying which, with
# 128 + N as a run does; and, once the sweep waits on it, sends the sweep argv[2].
STAND_IN_CELL = """
import os, pathlib, signal, sys, time
import psutil
def stop(signum, frame):
  pathlib.Path(sys.argv[1]).write_text(signal.Signals(signum).name)
  sys.exit(128 + signum)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
  signal.signal(sig, stop)
sweep = psutil.Process(os.getppid())
for _ in range(3000):  # Until it waits for this cell (blocked: sleeping).
  if sweep.status() == psutil.STATUS_SLEEPING:
    break
  time.sleep(0.01)
sweep.send_signal(int(sys.argv[2]))
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM],
                         ids=lambda sig: sig.name)
def test_a_stop_signal_to_a_sweep_stops_its_cell_by_that_signal(tmp_path, monkeypatch,
                                                                capsys, sig):
  """SIGHUP (an SSH session closing), SIGUSR1 (SLURM's warning) or SIGTERM sent to a
  sweep stop it as Ctrl-C does: the running cell gets the same signal, the table
  holds the cells so far, and the exit status is 128 + N (129, 138, 143)."""
  got, popen = tmp_path / "got", subprocess.Popen
  stand_in = lambda cmd, **kw: popen(
      [sys.executable, "-c", STAND_IN_CELL, str(got), str(int(sig))], **kw)
  monkeypatch.setattr(sweep_cell, "subprocess", types.SimpleNamespace(
      Popen=stand_in, DEVNULL=subprocess.DEVNULL, PIPE=subprocess.PIPE,
      TimeoutExpired=subprocess.TimeoutExpired))

  def not_the_sweeps(signum, frame):  # The default would end pytest's process.
    raise AssertionError(f"{signal.Signals(signum).name} reached the test, not the sweep")

  previous = signal.signal(sig, not_the_sweeps)
  try:
    result = sweep.run(*tiny_sweep(tmp_path, batch_sizes="4,8", run_name="s"))
    assert signal.getsignal(sig) is not_the_sweeps  # Given back after the sweep.
  finally:
    signal.signal(sig, previous)
  assert result["stop_signal"] == sig.name and main.exit_status(result) == 128 + sig
  assert got.read_text() == sig.name  # The cell's child, stopped by the same signal.
  [row] = cells.read_csv(tmp_path / "logs" / "s" / "sweep.csv")  # b8 never started.
  assert (row.batch_size, row.status, row.error) == (4, "interrupted", sig.name)
  assert "sweep interrupted" in capsys.readouterr().out


# A cell's child as the sweep sees it at its end: it leaves the summary.json argv[2]
# (none where empty), says argv[3] on stderr, counts argv[4] OOM kills in the stand-in
# counters, and exits with argv[5] (< 0: dies of that signal, its supervisor with it).
ENDING_CELL = """
import os, pathlib, signal, sys
run_dir, record, said, kills, code = sys.argv[1:]
if record:
  pathlib.Path(run_dir).mkdir(parents=True)
  (pathlib.Path(run_dir) / "summary.json").write_text(record)
pathlib.Path(os.environ["MPT_OOM_KILLS"]).write_text(f"oom_kill {kills}")
sys.stderr.write(said)
sys.stderr.flush()
if int(code) < 0:
  os.kill(os.getpid(), -int(code))
sys.exit(int(code))
"""
OOM_LOG_LINE = "W tf: ResourceExhaustedError: OOM when allocating (a log line)\n"


@pytest.mark.parametrize("record,said,kills,code,status,error", [
    # The run's record says how it ended, whatever its stderr says.
    (dict(status="failed", message="ValueError: bad"), OOM_LOG_LINE, 0, 1, "failed",
     "ValueError: bad"),
    (dict(status="completed", ms_per_step=12.5), "mpt: error: memory: (a log)\n", 0, 0,
     "ok", ""),
    (dict(status="diverged", message="mpt: diverged at step 3"), OOM_LOG_LINE, 0, 3,
     "diverged", "mpt: diverged at step 3"),
    (dict(status="oom", message="the training process died of SIGKILL"), "", 1, 4,
     "OOM", "the training process died of SIGKILL"),
    (dict(status="interrupted", message="mpt: interrupted at step 2"), "", 0, 143,
     "interrupted", "mpt: interrupted at step 2"),
    # No record: the exit status (errors.EXIT) says how, the last error line why.
    (None, "mpt: error: memory: batch 64 needs ~9 GiB\n", 0, 2, "OOM (predicted)",
     "mpt: error: memory: batch 64 needs ~9 GiB"),
    (None, "mpt: error: --model: unknown\n", 0, 2, "failed",
     "mpt: error: --model: unknown"),
    (None, "Traceback\nImportError: no tensorflow\n", 0, 1, "failed",
     "ImportError: no tensorflow"),
    (None, "mpt: oom: the training process died\n", 0, 4, "OOM",
     "mpt: oom: the training process died"),
    # Its supervisor died too: named by the OOM-kill counters, as the supervisor names.
    (None, OOM_LOG_LINE, 0, -signal.SIGKILL, "interrupted",
     "the training process was killed (SIGKILL) from outside mpt"),
    (None, "", 1, -signal.SIGKILL, "OOM", "the training process died of SIGKILL"),
])
def test_a_cell_ended_as_its_run_recorded_itself(tmp_path, monkeypatch, record, said,
                                                 kills, code, status, error):
  """Not by a word in its stderr: a run that failed, logging an OOM line, failed."""
  counters = tmp_path / "oom_kills"
  counters.write_text("oom_kill 0")
  monkeypatch.setenv("MPT_OOM_KILLS", str(counters))
  popen, cfg, opts = subprocess.Popen, *tiny_sweep(tmp_path, batch_sizes="4")
  cell, out = sweep.cells(cfg, opts)[0], tmp_path / "sweep"
  run_dir = out / "cells" / cell.id
  stand_in = lambda cmd, **kw: popen(
      [sys.executable, "-c", ENDING_CELL, str(run_dir),
       json.dumps(record) if record else "", said, str(kills), str(code)], **kw)
  monkeypatch.setattr(sweep_cell, "subprocess", types.SimpleNamespace(
      Popen=stand_in, DEVNULL=subprocess.DEVNULL, PIPE=subprocess.PIPE,
      TimeoutExpired=subprocess.TimeoutExpired))
  ended = sweep_cell.run_cell(cfg, cell, out, timeout=60)
  assert (ended.status, ended.error[:len(error)]) == (status, error)
  assert ended.ms == (12.5 if status == "ok" else None)
  assert ended.run_dir == str(run_dir)


def test_a_cell_interrupted_from_outside_does_not_stop_the_sweep(tmp_path, monkeypatch):
  """A cell whose run recorded `interrupted` without the sweep stopping it (a kill
  sent to that cell alone) is recorded so, and the sweep goes on to the next."""
  monkeypatch.setattr(sweep, "run_cell", lambda cfg, cell, out, timeout: (
      dataclasses.replace(cell, status="interrupted", error="mpt: interrupted at step 2")
      if cell.batch_size == 4 else dataclasses.replace(cell, status="ok", ms_per_step=1.0)))
  result = sweep.run(*tiny_sweep(tmp_path, batch_sizes="4,8", run_name="s"))
  assert (result["status"], result["stop_signal"], result["cells_not_completed"]) == (
      "completed", None, 1)
  rows = cells.read_csv(tmp_path / "logs" / "s" / "sweep.csv")
  assert [(r.batch_size, r.status) for r in rows] == [(4, "interrupted"), (8, "ok")]


@pytest.mark.parametrize("spec", ["oom", "oom:x", "melt:4", "kill:4,oops"])
def test_a_malformed_fault_injection_stops_the_sweep_before_any_cell(tmp_path,
                                                                     monkeypatch, spec):
  monkeypatch.setenv("MPT_INJECT_FAULT", spec)
  with pytest.raises(UserError, match="is not KIND:N\\[/POLICY\\] with KIND oom, kill, fail or segv"):
    sweep.run(*tiny_sweep(tmp_path, batch_sizes="4"))
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
    (dict(image_sizes="16,x"), "--image_sizes='16,x' must list whole numbers"),
    (dict(image_sizes="16,0"), "--image_sizes: --image_size must be >= 1"),
    (dict(models="vit,seed_convnet,vit"),
     "--models='vit,seed_convnet,vit' lists a value twice"),
    (dict(models="vit,"), "has an empty item"),
    (dict(models="seed_convnet,nope"),
     "--models: unknown --model='nope'; valid: mobilenet, resnet, seed_convnet"),
])
def test_bad_lists_fail_before_any_cell(tmp_path, overrides, words):
  with pytest.raises(UserError) as e:
    sweep.run(*tiny_sweep(tmp_path, **overrides))
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

| batch | float32 fit | mixed_bfloat16 fit | float32 custom | mixed_bfloat16 custom | mixed_bfloat16 fit time vs float32 | mixed_bfloat16 custom time vs float32 |
|---|---|---|---|---|---|---|
| 32 | 200.0 | 2500.0 | 190.0 | 2400.0 | 12.5x | 12.6x |
| 64 | 380.0 | OOM | timeout | 4600.0 | - | - |
"""


def test_markdown_table_for_a_known_csv_matches_golden(tmp_path):
  (tmp_path / "sweep.csv").write_text(KNOWN_CSV)
  rows = cells.read_csv(tmp_path / "sweep.csv")
  assert sweep_report.markdown(rows) == GOLDEN


def test_without_matplotlib_the_plot_is_skipped_and_says_so(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  rows = [Cell.from_row(r) for r in csv.DictReader(io.StringIO(KNOWN_CSV))]
  message = sweep_report.plot(rows, tmp_path / "sweep.png")
  assert message.startswith("plot skipped: matplotlib is not installed")
  assert not (tmp_path / "sweep.png").exists()


@pytest.mark.parametrize("cfg,opts,name", [
    (config.Config(synthetic_train=40, batchnorm="keras"),
     SweepOptions(batch_sizes="4,8", policies="float32,mixed_bfloat16"), "sweep-fbbd7cd5"),
    (config.Config(batchnorm="keras"), SweepOptions(), "sweep-41eac7a2"),
])
def test_the_sweep_folder_keeps_its_name_for_the_same_command(cfg, opts, name):
  # Names the sweep gave these commands when all modes shared one flag set: a sweep
  # folder on disk must still be found (and resumed) by the command that made it.
  # Those sweeps ran Keras' BatchNorm; under today's default (fused) the same flags
  # measure something else, and get a folder of their own.
  assert sweep.sweep_dir(cfg, opts).name == name
  fused = dataclasses.replace(cfg, batchnorm="fused")
  assert sweep.sweep_dir(fused, opts).name not in (name, "")
  # Where and how the sweep runs is not part of its name.
  moved = dataclasses.replace(cfg, logdir="elsewhere", verbose=0, force=True)
  assert sweep.sweep_dir(moved, dataclasses.replace(
      opts, cell_timeout=9.0)) == pathlib.Path("elsewhere") / name


def test_the_cells_child_flags_are_the_run_with_the_cells_values(tmp_path):
  cfg, opts = tiny_sweep(tmp_path, batch_sizes="4,8", jit_compiles="false,true",
                         image_sizes="16,24", models="seed_convnet,vit")
  every = sweep.cells(cfg, opts)
  # Each value of each axis with each of the others', once; a list of the single-run
  # flag's value where the sweep gives none (policy, loop).
  assert sorted((c.model, c.image_size, c.batch_size, c.jit_compile) for c in every) == [
      (m, i, b, x) for m in ("seed_convnet", "vit") for i in (16, 24) for b in (4, 8)
      for x in (False, True)]
  assert {(c.policy, c.loop) for c in every} == {(cfg.policy, cfg.loop)}
  cell = every[-1]
  assert (cell.model, cell.image_size, cell.batch_size, cell.jit_compile, cell.id) == (
      "vit", 24, 8, True, "vit_24px_b8_float32_fit_xla")
  flags = sweep_cell.cell_flags(cfg, cell, tmp_path)
  run = config.from_flagfile("\n".join(flags))
  assert run == dataclasses.replace(cfg, batch_size=8, jit_compile=True, image_size=24,
                                    model="vit", verbose=0, run_name=cell.id,
                                    logdir=str(tmp_path / "cells"),
                                    checkpoint=False)  # A cell is never resumed.
  assert not [f for f in flags if f.startswith("--mode=")]  # The child trains.


# What sweep.csv held before Cell owned it, byte for byte (csv's \r\n included).
CSV_BYTES = (
    b"model,image_size,batch_size,policy,loop,jit_compile,status,ms_per_step,"
    b"images_per_sec,peak_rss_mb,cpu_percent,val_accuracy,device,error,run_dir,"
    b"tf_version,cpu,cpu_isa\r\n"
    b"seed_convnet,64,16,float32,fit,False,ok,150.86648099895683,106.0540412559277,"
    b"913.89453125,154.0,0.104,CPU: AMD EPYC (2 logical cores),,/s/cells/a,2.21.0,"
    b"AMD EPYC,sse4_2 avx avx2 fma f16c\r\n"
    b"seed_convnet,64,32,mixed_bfloat16,fit,True,OOM,,,,,,,killed (SIGKILL),/s/cells/b,"
    b"2.21.0,AMD EPYC,sse4_2 avx avx2 fma f16c\r\n")


def test_sweep_csv_rows_are_written_and_read_back_as_cells(tmp_path):
  env = dict(tf_version="2.21.0", cpu="AMD EPYC", cpu_isa="sse4_2 avx avx2 fma f16c")
  ok = Cell("seed_convnet", 64, 16, "float32", "fit", False, "ok", 150.86648099895683,
            106.0540412559277, 913.89453125, 154.0, 0.104,
            "CPU: AMD EPYC (2 logical cores)", run_dir="/s/cells/a", **env)
  oom = Cell("seed_convnet", 64, 32, "mixed_bfloat16", "fit", True, "OOM",
             error="killed (SIGKILL)", run_dir="/s/cells/b", **env)
  path = tmp_path / "sweep.csv"
  cells.append_csv(path, ok)
  cells.append_csv(path, oom)
  # Today's file: the same, with the columns of --launcher=ray at the end.
  assert path.read_bytes() == CSV_BYTES.replace(
      b"cpu_isa\r\n", b"cpu_isa,machine,granted_gpus,granted_memory_mb,seed,train_loss,"
      b"train_accuracy,val_loss\r\n").replace(b"f16c\r\n", b"f16c,,,,0,,,\r\n")
  assert cells.read_csv(path) == [ok, oom]
  (tmp_path / "old.csv").write_bytes(CSV_BYTES)  # A file from before that column.
  assert cells.read_csv(tmp_path / "old.csv") == [ok, oom]
  assert (ok.ms, oom.ms) == (150.86648099895683, None)  # An OOM has no figure.
  assert oom.id == "seed_convnet_64px_b32_mixed_bfloat16_fit_xla"
  assert oom.label == "seed_convnet 64px b32 mixed_bfloat16 fit xla"
  # A cell run again: readers see its newest row, where the cell first appeared.
  cells.append_csv(path, dataclasses.replace(ok, status="failed", error="boom"))
  assert [(c.id, c.status) for c in cells.read_csv(path)] == [
      (ok.id, "failed"), (oom.id, "OOM")]
  assert cells.read_csv(tmp_path / "none.csv") == []


@pytest.mark.parametrize("text,xla", [("True", True), ("true", True), ("1", True),
                                      ("False", False), ("false", False), ("0", False),
                                      ("", False)])
def test_a_rows_xla_setting_is_parsed_in_one_place(text, xla):
  cell = Cell.from_row(dict(model="m", image_size="64", batch_size="4", policy="float32",
                            loop="fit", jit_compile=text, status="ok"))
  assert cell.jit_compile is xla and cell.id.endswith("_xla") == xla
  assert cell.ms_per_step is None and cell.ms is None  # Empty or missing: no figure.


def test_a_finished_cells_figures_come_from_its_summary(tmp_path):
  path = tmp_path / "summary.json"
  summary_lib.RunSummary(status="completed", ms_per_step=12.5, images_per_sec=320.0,
                         val_accuracy=0.5, device="CPU", util=Utilisation(
                             rss_mb=Stat(mean=800.0, max=900.0),
                             process_cpu_percent=Stat(mean=150.0, max=190.0))).write(path)
  assert cells.figures_from_summary(path) == dict(
      ms_per_step=12.5, images_per_sec=320.0, val_accuracy=0.5, device="CPU",
      peak_rss_mb=900.0, cpu_percent=150.0, train_loss=None, train_accuracy=None,
      val_loss=None)
  path.write_text(json.dumps({"ms_per_step": 12.5, "images_per_sec": 320.0,
                              "train_loss": 1.5, "val_loss": 1.75}))
  assert cells.figures_from_summary(path) == dict(  # Version 1, no utilisation.
      ms_per_step=12.5, images_per_sec=320.0, val_accuracy=None, device="",
      peak_rss_mb=None, cpu_percent=None, train_loss=1.5, train_accuracy=None,
      val_loss=1.75)


def test_cells_predicted_not_to_fit_are_recorded_without_starting(tmp_path, monkeypatch):
  """A finished cell's summary.json tells each policy's memory per example; a later
  cell of the same model and size that would not fit is `OOM (predicted)`, unstarted
  (--force starts it), and the sweep's memory finding reads it as an OOM."""
  from mpt.measure import memory
  monkeypatch.setattr(memory, "available_mb", lambda: (1000.0, "available (test)"))
  plan = MemoryPlan(  # float32 needs 100 MB per example, bfloat16 50.
      Estimate("float32", 4, 500.0, 50.0, 25.0, 25.0, 0.0, 100.0, 0.0),
      policies={"float32": Line(600.0, 100.0, 500.0),
                "mixed_bfloat16": Line(600.0, 50.0, 500.0)})
  started = []

  def fake_run(cfg, cell, out, timeout):
    started.append((cell.batch_size, cell.policy))
    run_dir = out / "cells" / cell.id
    run_dir.mkdir(parents=True, exist_ok=True)
    summary_lib.RunSummary(status="completed", memory=plan).write(run_dir / "summary.json")
    return dataclasses.replace(cell, status="ok", ms_per_step=10.0, run_dir=str(run_dir))

  monkeypatch.setattr(sweep, "run_cell", fake_run)
  cfg, opts = tiny_sweep(tmp_path, batch_sizes="4,16", policies="float32,mixed_bfloat16")
  sweep.run(cfg, opts)
  rows = {(r.batch_size, r.policy): r for r in cells.read_csv(
      sweep.sweep_dir(cfg, opts) / "sweep.csv")}
  # 16 x 100 MB beyond the 500 MB in use > 1000 MB available; 16 x 50 MB is not.
  assert started == [(4, "float32"), (4, "mixed_bfloat16"), (16, "mixed_bfloat16")]
  assert rows[16, "float32"].status == "OOM (predicted)"
  assert rows[16, "float32"].error == (
      "needs ~2.1 GiB, 1000 MiB available (test); largest batch that fits ~9")
  findings = diagnose_sweep.memory(list(rows.values()))
  assert [f.id for f in findings] == ["memory:mixed_bfloat16"]
  sweep.run(dataclasses.replace(cfg, force=True), opts)  # Starts it, and reruns all.
  assert (16, "float32") in started[3:]


def test_seeds_are_an_axis_and_the_cells_flags_carry_each_seed(tmp_path):
  cfg, opts = tiny_sweep(tmp_path, policies="float32,mixed_bfloat16", seeds=3,
                         batch_sizes="4")
  every = sweep.cells(dataclasses.replace(cfg, seed=7), opts)
  assert sorted((c.policy, c.seed) for c in every) == [
      (p, s) for p in ("float32", "mixed_bfloat16") for s in (7, 8, 9)]
  assert len({c.id for c in every}) == 6 and every[0].id.endswith("_s7")
  run = config.from_flagfile("\n".join(sweep_cell.cell_flags(cfg, every[1], tmp_path)))
  assert run.seed == every[1].seed
  # One seed (the default) names cells and the sweep's folder as before.
  assert sweep.cells(cfg, dataclasses.replace(opts, seeds=1))[0].seed == cfg.seed == 0
  assert "_s" not in sweep.cells(cfg, dataclasses.replace(opts, seeds=1))[0].id


def _seeded(policy: str, seed: int, val_accuracy: float, train_loss: float) -> Cell:
  return Cell("seed_convnet", 64, 32, policy, "fit", False, "ok", 100.0 + seed,
              val_accuracy=val_accuracy, seed=seed, train_loss=train_loss,
              train_accuracy=0.5, val_loss=1.0)


def test_a_seeded_sweep_reports_accuracy_beside_speed_and_which_policy_stayed_within(
    tmp_path):
  """float32 over 3 seeds: val_accuracy 0.40..0.44 (widened by its width: 0.36..0.48);
  mixed_bfloat16's mean 0.4333 within it (its seed at 0.50 alone would not be),
  mixed_float16's mean 0.30 outside."""
  rows = [_seeded("float32", s, a, 1.2) for s, a in enumerate((0.40, 0.42, 0.44))]
  rows += [_seeded("mixed_bfloat16", s, a, 1.2) for s, a in enumerate((0.47, 0.50, 0.33))]
  rows += [_seeded("mixed_float16", s, a, 1.2) for s, a in enumerate((0.30, 0.32, 0.28))]
  for r in rows:
    cells.append_csv(tmp_path / "sweep.csv", r)
  table = sweep_report.markdown(cells.read_csv(tmp_path / "sweep.csv"))
  assert "| 32 | 101.0 | 101.0 | 101.0 |" in table  # The median ms/step over seeds.
  assert "| seed_convnet 64 px fit | 32 | mixed_bfloat16 | 3 | train_loss 1.2 " in table
  assert "val_accuracy 0.4333 (0.33..0.5 over 3 seeds) |" in table
  lines = {l.split(" | ")[2]: l for l in table.splitlines() if l.startswith("| seed_")}
  assert lines["mixed_bfloat16"].endswith("| yes |")
  assert "| no: val_accuracy 0.3 outside float32's 0.4..0.44 (3 seeds) |" in \
      lines["mixed_float16"]
  from mpt.diagnose import sweep as diagnose_sweep
  report = diagnose_sweep.diagnose(tmp_path)
  assert [f["id"] for f in report["findings"]] == ["metrics_spread:mixed_float16"]
  assert report["findings"][0]["severity"] == "high"
  said = "\n".join(report["accuracy"])
  assert "mixed_bfloat16 at seed_convnet 64 px b32 fit: within float32's spread" in said
  assert "mixed_float16 at seed_convnet 64 px b32 fit: OUTSIDE" in said


def test_a_ray_task_started_with_sigint_ignored_listens_for_its_cancel(monkeypatch):
  """The fast guard of the cluster's Ctrl-C fix (the slow one: test_cluster.py's
  `&`-started sweep): a worker that inherited SIGINT ignored gets Python's handler
  back on its main thread, so a non-forced ray.cancel raises there; on another thread
  nothing changes."""
  import signal
  import threading
  from mpt.sweep import cluster
  before = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    seen = []
    worker = threading.Thread(target=lambda: (cluster._listen_for_cancel(),
                                              seen.append(signal.getsignal(signal.SIGINT))))
    worker.start()
    worker.join()
    assert seen == [signal.SIG_IGN]
    cluster._listen_for_cancel()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # The task itself listens before its cell starts.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    handlers = []
    monkeypatch.setattr(cluster.cell_lib, "run_cell", lambda cfg, cell, *a: (
        handlers.append(signal.getsignal(signal.SIGINT)) or cell))
    cluster._run_on_node(None, cells.Cell(), None, None)
    assert handlers == [signal.default_int_handler]
  finally:
    signal.signal(signal.SIGINT, before)
