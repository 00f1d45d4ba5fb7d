"""Failures that say what happened, and a process schedulers and shells can drive: each
failure made to happen for real in a child process (`python -m mpt`, as a user or a
scheduler runs it), checking the line the user reads, the exit status (errors.EXIT)
and that nothing recorded is lost."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT, read_events, start_and_wait_for_an_epoch, tiny_cli, wait_for
from mpt import errors


def test_flag_errors_exit_like_any_bad_input():
  for flag, words in (("--policy=foo", "value should be one of"),
                      ("--batch_size=0", "0 is not a positive integer")):
    proc = subprocess.run([sys.executable, "-m", "mpt", flag], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == errors.EXIT["usage"] == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mpt: error: flag {flag}: ")
    assert words in lines[0]


# A TensorFlow that aborts while importing, saying why first, as TF's CPU-feature guard
# does for a wheel built for instructions this CPU lacks.
ABORTING_TF = """
import os
os.write(2, b"I0000 00:00:1.0  1 port.cc:153] oneDNN custom operations are on.\\n")
os.write(2, b"F0000 00:00:1.0  1 cpu_feature_guard.cc:94] The TensorFlow library was "
            b"compiled to use AVX512F instructions, but these aren't available on your "
            b"machine.\\n")
os.abort()
"""


@pytest.mark.parametrize("mode", ["inspect", "train"])
def test_an_abort_while_importing_tensorflow_keeps_its_line(tmp_path, mode):
  (tmp_path / "fake" / "tensorflow").mkdir(parents=True)
  (tmp_path / "fake" / "tensorflow" / "__init__.py").write_text(textwrap.dedent(ABORTING_TF))
  env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'fake'}:{ROOT}"}
  proc = subprocess.run([sys.executable, "-m", "mpt", f"--mode={mode}",
                         f"--logdir={tmp_path}/logs"], capture_output=True, text=True,
                        timeout=120, cwd=tmp_path, env=env)
  lines = proc.stderr.strip().splitlines()
  guard = [l for l in lines if "compiled to use AVX512F instructions" in l]
  assert guard and not any("oneDNN custom operations" in l for l in lines)
  if mode == "inspect":  # No supervisor: the filter process passed the line on.
    assert proc.returncode == -signal.SIGABRT
    return
  # Training: the supervisor names the death from that line, not "out of memory".
  assert proc.returncode == errors.EXIT["crashed"] == 5, proc.stderr[-2000:]
  assert lines[-1].startswith("mpt: failed: the training process died of SIGABRT before "
                              "its run folder existed (starting up): this TensorFlow was "
                              "built for AVX512F instructions, which this CPU lacks")
  assert "memory" not in lines[-1] and lines[-3] == \
      "mpt: the training process' last error lines:"


# TensorFlow as it starts on a host with its CUDA libraries and no NVIDIA driver: the
# cuInit line recorded on the SPR machine (tests/data/onednn/intel_spr_amx_float32.log),
# then the real TensorFlow, which this module hands its name over to. A CPU wheel never
# prints the line, so without this the promise would go unchecked on CPU-only hosts.
NO_DRIVER_TF = """
import importlib, os, sys
os.write(2, {line!r})
fake = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != fake]
del sys.modules["tensorflow"]
sys.modules["tensorflow"] = importlib.import_module("tensorflow")
"""


def no_driver_tf(tmp_path) -> str:
  """A folder for PYTHONPATH whose `tensorflow` says the cuInit line, then imports."""
  line = (ROOT / "tests" / "data" / "onednn" / "intel_spr_amx_float32.log").read_bytes(
      ).splitlines(keepends=True)[6]
  assert b"failed call to cuInit" in line
  (tmp_path / "no_driver" / "tensorflow").mkdir(parents=True)
  (tmp_path / "no_driver" / "tensorflow" / "__init__.py").write_text(
      NO_DRIVER_TF.format(line=line))
  return str(tmp_path / "no_driver")


def test_a_segfault_is_a_crash_not_out_of_memory(tmp_path):
  """Also on a host with TF's CUDA libraries and no driver: mpt says so once, in its
  own words (docs/usage.md), instead of TensorFlow's cuInit error line."""
  env = {**os.environ, "MPT_INJECT_FAULT": "segv:4",
         "PYTHONPATH": f"{no_driver_tf(tmp_path)}:{ROOT}"}
  proc = subprocess.run(tiny_cli(tmp_path, "--run_name=r"), capture_output=True,
                        text=True, timeout=180, cwd=ROOT, env=env)
  assert proc.returncode == errors.EXIT["crashed"], proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()
  assert last[-1].startswith("mpt: failed: the training process died of SIGSEGV while "
                             "training (no OOM kill counted: not memory")
  assert "  native crash (injected: MPT_INJECT_FAULT=segv:4)" in last[-3:-1]
  summary = json.loads((tmp_path / "logs" / "r" / "summary.json").read_text())
  assert summary["status"] == "failed" and "SIGSEGV" in summary["message"]
  said = [l for l in proc.stdout.splitlines() if l.startswith("mpt: no GPU used: ")]
  assert len(said) == 1 and "no NVIDIA driver answered" in said[0], proc.stdout
  assert "failed call to cuInit" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1])
def test_a_schedulers_signal_stops_at_a_step_with_a_checkpoint(tmp_path, children, sig):
  """SIGHUP (an SSH session closing) and SIGUSR1 (SLURM's --signal warning) sent to
  the supervisor, as a shell or scheduler sends them. The training child records the
  affinity mask it inherited from this process (under `taskset -c 0`: one CPU; a
  narrower mask's count: tests/machine/test_hardware.py)."""
  proc = start_and_wait_for_an_epoch(children, tmp_path)
  proc.send_signal(sig)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 128 + sig, err[-2000:]
  assert f"mpt: {sig.name}: stopping after this step" in err and "Traceback" not in err
  run = tmp_path / "logs" / "r"
  summary = json.loads((run / "summary.json").read_text())
  assert (summary["status"], summary["stop_signal"]) == ("interrupted", sig.name)
  assert f"checkpoint {run}/checkpoints/ckpt-{summary['steps']}" in out
  assert summary["epochs_completed"] >= 1 and "train/loss" in read_events(run)
  hw = summary["hardware"]
  assert hw["affinity_cpus"] == len(os.sched_getaffinity(0))
  assert 1 <= hw["cpu_count"] <= hw["affinity_cpus"]


def test_a_stop_after_the_run_folder_was_removed_says_so(tmp_path, children):
  import shutil
  import psutil
  proc = start_and_wait_for_an_epoch(children, tmp_path, "--checkpoint_every=0")
  # The training child is frozen while its folder goes and the stop is sent: else its
  # next epoch end (2 steps on) may find the folder gone before the signal arrives,
  # and end the run by itself.
  training = [p for p in psutil.Process(proc.pid).children()
              if "mpt.main" in " ".join(p.cmdline())]
  assert len(training) == 1, training
  training[0].suspend()
  try:
    # Stopped before the signal goes: a SIGTERM sent while SIGSTOP is still pending is
    # taken first (the lower number) on a loaded box, and is then never seen pending.
    assert wait_for(lambda: training[0].status() == psutil.STATUS_STOPPED, 10)
    shutil.rmtree(tmp_path / "logs", ignore_errors=True)
    # Sent to the training child itself, where the supervisor would forward it (that
    # forwarding: the scheduler's-signal tests above). Sent through the supervisor, a
    # loaded box was seen (2-core Zen 5, -n 3) forwarding it only after this test had
    # given up waiting and sent another, which the child then took as a second signal.
    training[0].send_signal(signal.SIGTERM)
    assert wait_for(lambda: signal.SIGTERM in _pending(training[0].pid), 10)
  finally:
    training[0].resume()
  out, err = proc.communicate(timeout=60)  # One step and no checkpoint to write.
  assert proc.returncode == 143, err[-2000:]
  assert f"the run folder {tmp_path / 'logs' / 'r'} was removed while the run ran" in err
  assert not (tmp_path / "logs" / "r" / "summary.json").exists()
  assert "Traceback" not in err


def _pending(pid: int) -> set[signal.Signals]:
  """The signals pending for the process (its /proc status' SigPnd and ShdPnd)."""
  bits = 0
  for line in open(f"/proc/{pid}/status"):
    if line.startswith(("SigPnd:", "ShdPnd:")):
      bits |= int(line.split()[1], 16)
  return {signal.Signals(n) for n in range(1, 65) if bits >> (n - 1) & 1
          and n in signal.Signals._value2member_map_}
