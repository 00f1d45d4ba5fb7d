"""mpt/supervisor.py: the kernel's OOM-kill counters read from recorded /proc and cgroup
files, and what a death by signal leaves in summary.json and runs.csv for each thing the
counters can say. The end-to-end deaths (a child killed under `python -m mpt.main`) are
in tests/measure/test_memory.py."""

import json
import signal

import pytest

from mpt import supervisor
from helpers import ROOT
from mpt.records import summary as summary_lib


def _write(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)


def test_oom_kill_counters_of_the_memory_cgroup_and_the_host(tmp_path, monkeypatch):
  """A hybrid cgroup host (v1 memory controller, v2 unified tree), as the dev machine
  has, and /proc/vmstat; files that are not there are left out."""
  proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
  _write(proc / "vmstat", "nr_free_pages 12\noom_kill 3\npgfault 9\n")
  _write(proc / "self" / "cgroup", "9:name=systemd:/\n4:memory:/api/abc\n0::/user.slice\n")
  _write(cgroup / "memory" / "api" / "abc" / "memory.oom_control",
         "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
  _write(cgroup / "user.slice" / "memory.events", "low 0\nhigh 0\nmax 4\noom 2\noom_kill 7\n")
  monkeypatch.setattr(supervisor, "PROC", proc)
  monkeypatch.setattr(supervisor, "CGROUP", cgroup)
  monkeypatch.delenv(supervisor.OOM_KILLS_ENV)
  assert supervisor.oom_kills() == {
      str(proc / "vmstat"): 3,
      str(cgroup / "memory" / "api" / "abc" / "memory.oom_control"): 1,
      str(cgroup / "user.slice" / "memory.events"): 7}
  (cgroup / "user.slice" / "memory.events").unlink()
  (proc / "vmstat").write_text("nr_free_pages 12\n")  # A kernel older than 4.13.
  assert list(supervisor.oom_kills()) == [
      str(cgroup / "memory" / "api" / "abc" / "memory.oom_control")]


def test_the_stand_in_file_replaces_the_kernels_counters(tmp_path, monkeypatch):
  monkeypatch.setattr(supervisor, "PROC", tmp_path / "nothing")
  stand_in = tmp_path / "counters"
  stand_in.write_text("oom_kill 5\n")
  monkeypatch.setenv(supervisor.OOM_KILLS_ENV, str(stand_in))
  assert supervisor.oom_kills() == {str(stand_in): 5}
  supervisor.count_stand_in_oom_kill()  # An injected OOM kill counts itself there.
  assert supervisor.oom_kills() == {str(stand_in): 6}


@pytest.mark.parametrize("before,after,killed", [
    ({"a": 1, "b": 0}, {"a": 1, "b": 1}, True),
    ({"a": 1, "b": 0}, {"a": 1, "b": 0}, False),
    ({"a": 1}, {"b": 2}, None),  # Nothing read twice: unknown.
    ({}, {}, None),
])
def test_an_oom_kill_is_a_counter_that_rose(before, after, killed):
  assert supervisor.oom_killed(before, after) is killed


ISA_LINE = ("F0000 00:00:1.0  1 cpu_feature_guard.cc:94] The TensorFlow library was "
            "compiled to use AVX512F instructions, but these aren't available on your "
            "machine.")


@pytest.mark.parametrize("sig,counted,last,status,code,words", [
    (signal.SIGKILL, False, [], "interrupted", 137,
     "killed (SIGKILL) from outside mpt, not by the kernel's OOM killer"),
    (signal.SIGKILL, True, [], "oom", 4,
     "died of SIGKILL while training: the kernel counted an OOM kill while it ran"),
    (signal.SIGKILL, None, [], "oom", 4,
     "most likely out of memory (no OOM-kill counter readable)"),
    (signal.SIGSEGV, False, ["some native error"], "failed", 5,
     "died of SIGSEGV while training (no OOM kill counted: not memory"),
    (signal.SIGABRT, False, ["terminate called after throwing an instance of "
                             "'std::bad_alloc'"], "oom", 4,
     "died of SIGABRT while training: out of memory, as its last error line says"),
    (signal.SIGABRT, None, [ISA_LINE], "failed", 5,
     "this TensorFlow was built for AVX512F instructions, which this CPU lacks"),
    (signal.SIGBUS, None, [], "failed", 5, "died of SIGBUS while training (no OOM-kill "
     "counter readable: not memory"),
])
def test_a_death_by_signal_is_named_by_its_evidence(tmp_path, capsys, sig, counted, last,
                                                    status, code, words):
  run_dir = tmp_path / "logs" / "r"
  run_dir.mkdir(parents=True)
  summary_lib.RunSummary(run_dir=str(run_dir), status="running").write(
      run_dir / "summary.json")
  assert supervisor._died(supervisor.Death(sig, counted, last), run_dir) == code
  on_disk = json.loads((run_dir / "summary.json").read_text())
  assert on_disk["status"] == status and words in on_disk["message"]
  assert (f"--resume={run_dir}" in on_disk["message"]) == (status == "interrupted")
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith(f"mpt: {status}: ") and words in err[-1]
  if last and status != "interrupted":  # The child's own last words, shown above.
    assert err[-3:-1] == ["mpt: the training process' last error lines:",
                          f"  {last[-1]}"]
  rows = (tmp_path / "logs" / "runs.csv").read_text().splitlines()
  assert len(rows) == 2 and f",{status}," in rows[1]


def test_a_finished_run_keeps_its_status(tmp_path, capsys):
  """Killed after it wrote `completed` (in its last moments): nothing is rewritten."""
  run_dir = tmp_path / "r"
  run_dir.mkdir()
  summary_lib.RunSummary(run_dir=str(run_dir), status="completed").write(
      run_dir / "summary.json")
  supervisor._died(supervisor.Death(signal.SIGKILL, False, []), run_dir)
  assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
  assert not (tmp_path / "runs.csv").exists()


def test_the_start_up_filter_drops_tfs_notices_and_notes_the_no_driver_line():
  """TF 2.21's start-up lines as a CPU-only process prints them (the cuInit line as
  recorded on the SPR machine, tests/data/onednn/intel_spr_amx_float32.log)."""
  from mpt import console
  cuinit = (ROOT / "tests" / "data" / "onednn" / "intel_spr_amx_float32.log").read_bytes(
      ).splitlines(keepends=True)[6]
  assert b"failed call to cuInit" in cuinit
  lines = [
      b"WARNING: All log messages before absl::InitializeLog() is called are written to "
      b"STDERR\n",
      b"I0000 00:00:1796429403.401261   10435 port.cc:153] oneDNN custom operations are "
      b"on.\n",
      b"I0000 00:00:1796429403.402000   10435 cpu_feature_guard.cc:210] This TensorFlow "
      b"binary is optimized to use available CPU instructions.\n",
      b"To enable the following instructions: AVX512_FP16, in other operations, rebuild "
      b"TensorFlow with the appropriate compiler flags.\n",
      cuinit,
      b"E0000 00:00:1796429409.0 10435 some_op.cc:1] a real error\n",
      b"Traceback (most recent call last):\n",
      b"  File \"x.py\", line 1, in <module>\n"]
  found = console.StartupFilter()
  kept = [l for l in lines if found.keep(l)]
  assert kept == lines[5:] and found.no_driver
  clean = console.StartupFilter()
  assert [l for l in lines[5:] if clean.keep(l)] == lines[5:] and not clean.no_driver
  # The supervisor reads the whole run: mpt's own lines after TF's INFO lines (the
  # guard's continuation included) and after the cuInit line all pass.
  ours = [b"mpt: epoch 1/2: 10 steps\n", b"native crash (injected)\n",
          b"mpt: SIGTERM: stopping after this step\n"]
  run = console.StartupFilter()
  assert [l for l in lines[:5] + ours if run.keep(l)] == ours and run.no_driver
  run = console.StartupFilter()
  assert [l for l in lines[2:4] + ours if run.keep(l)] == ours
