"""runs.csv (mpt/records/runs.py): 8 processes appending at once leave 8 whole lines
under one header; a row read back is the row written; a file with another version's
header keeps it; a run is always one line; recording never fails a run.

The concurrent writers are plain `python -c` children importing mpt.records.runs only
(no TensorFlow), started together behind a barrier file so that their appends race.
"""

import csv
import subprocess
import sys

from mpt.records import runs
from mpt.records import summary as summary_lib

from helpers import DATA, ROOT, wait_for

WRITERS = 8
# Each child waits for the barrier file, then appends one row with a long run_dir, so
# that an append that is not one locked write would show as a torn or mixed line.
CHILD = """
import pathlib, sys, time
from mpt.records import runs
barrier, path, i = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(barrier.parent / f"ready-{i}").touch()  # Started: now waiting at the barrier.
deadline = time.time() + 60
while not barrier.exists() and time.time() < deadline:
  time.sleep(0.001)
runs.append(path, runs.Row(time="t", run_dir=f"run{i}-" + "x" * 50000, status="completed",
                           policy="float32", batch_size=i, ms_per_step=i + 0.5))
print("TF" if "tensorflow" in sys.modules else "no TF")
"""


def test_eight_processes_appending_at_once_leave_eight_whole_lines(tmp_path):
  path, barrier = tmp_path / "runs.csv", tmp_path / "go"
  procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(barrier), str(path),
                             str(i)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
           for i in range(WRITERS)]
  # Every child at the barrier before it opens: the appends then race for real.
  assert wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == WRITERS, 60)
  barrier.touch()
  outs = [p.communicate(timeout=120)[0] for p in procs]
  assert [p.returncode for p in procs] == [0] * WRITERS
  assert all(o.strip() == "no TF" for o in outs), outs
  lines = path.read_text().split("\n")
  assert lines[-1] == "" and len(lines) == WRITERS + 2  # 8 rows + header, newline-ended.
  parsed = list(csv.reader(lines[:-1]))
  assert parsed[0] == list(runs.COLUMNS)
  assert all(len(r) == len(runs.COLUMNS) for r in parsed)
  rows = runs.read(path)
  assert sorted(r.batch_size for r in rows) == list(range(WRITERS))
  for r in rows:
    assert r.run_dir == f"run{r.batch_size}-" + "x" * 50000
    assert r.ms_per_step == r.batch_size + 0.5


def test_a_run_reads_back_as_it_was_recorded(tmp_path):
  s = summary_lib.read(DATA / "runs" / "f16_custom" / "summary.json")
  row = runs.Row.from_summary(s)
  runs.append(tmp_path / "runs.csv", row)
  runs.append(tmp_path / "runs.csv", row)
  back = runs.read(tmp_path / "runs.csv")
  assert back == [row, row]
  assert (back[0].policy, back[0].loop, back[0].batch_size) == ("mixed_float16",
                                                                "custom", 32)
  assert back[0].ms_per_step == s.ms_per_step and back[0].val_accuracy == s.val_accuracy
  assert back[0].time.endswith("+00:00") and back[0].jit_compile is False
  assert runs.read(tmp_path / "none.csv") == []


def test_a_file_with_another_versions_header_keeps_it(tmp_path):
  path = tmp_path / "runs.csv"
  path.write_text("run_dir,status,policy,retired_column\nold,completed,float32,x\n")
  runs.append(path, runs.Row(time="t", run_dir="new", status="diverged",
                             policy="mixed_float16", ms_per_step=3.0))
  assert path.read_text().splitlines()[-1] == "new,diverged,mixed_float16,"
  assert [(r.run_dir, r.status, r.ms_per_step) for r in runs.read(path)] == [
      ("old", "completed", None), ("new", "diverged", None)]


def test_a_run_is_one_line_whatever_its_fields_hold(tmp_path):
  path = tmp_path / "runs.csv"
  runs.append(path, runs.Row(run_dir="a\nb,c", model='m"1'))
  lines = path.read_text().splitlines()
  assert len(lines) == 2
  assert runs.read(path)[0].run_dir == "a b,c" and runs.read(path)[0].model == 'm"1'


def test_recording_writes_next_to_the_run_and_never_raises(tmp_path, capsys):
  run = tmp_path / "logs" / "r1"
  run.mkdir(parents=True)
  s = summary_lib.RunSummary(status="failed", run_dir=str(run), policy="float32")
  assert runs.record(s) == tmp_path / "logs" / "runs.csv"
  assert [(r.run_dir, r.status) for r in runs.read(tmp_path / "logs" / "runs.csv")] == \
      [(str(run), "failed")]
  blocked = tmp_path / "a_file"
  blocked.write_text("")
  s.run_dir = str(blocked / "r2")  # Its parent is a file: no runs.csv there.
  assert runs.record(s) is None
  assert "mpt: could not append to" in capsys.readouterr().err
  assert runs.record(summary_lib.RunSummary(run_dir=None)) is None
