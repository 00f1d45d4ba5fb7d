"""The command line as a user meets it: real child processes, exit codes, stderr."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from helpers import ROOT, mpt, read_events, start_and_wait_for_an_epoch


def error_lines(stderr: str) -> list[str]:
  """stderr without TensorFlow's own start-up chatter (which no flag silences)."""
  noise = ("WARNING: All log messages", "I0000", "W0000", "E0000", "To enable the",
           "oneDNN", "cuda", "CUDA", "computation placer", "absl::InitializeLog")
  return [l for l in stderr.splitlines() if l.strip() and not
          any(n in l for n in noise) and not l.startswith(("I1", "W1", "E1"))]


@pytest.mark.parametrize("args,words", [
    (["--policy=mixed_int8"], "value should be one of <float32|mixed_float16|mixed_bfloat16|auto>"),
    (["--loop=keras"], "value should be one of <fit|custom>"),
    (["--strategy=ring"], "value should be one of <default|mirrored|multi_worker|tpu>"),
    (["--batch_size=0"], "--batch_size=0"),
    (["--image_size=-1"], "--image_size=-1"),
    (["--epochs=0"], "--epochs=0"),
])
def test_flag_errors_are_reported_by_absl_without_traceback(args, words):
  proc = mpt(*args)
  assert proc.returncode != 0
  assert words in proc.stderr and "Traceback" not in proc.stderr


def main_in_process(*args: str) -> int:
  """mpt.main's flag parsing and main(), in this process (no second TF import)."""
  from mpt import main as mpt_main
  try:
    return mpt_main.main(mpt_main.FLAGS(["mpt", *args]))
  finally:
    mpt_main.FLAGS.unparse_flags()


BAD_INPUT = [
    (["--model=resnet9000"], "mpt: error: unknown --model='resnet9000'; valid: mobilenet, resnet, seed_convnet"),
    (["--dataset=folder:/no/such/dir"], "mpt: error: folder dataset '/no/such/dir' does not exist"),
    (["--dataset=imagenettx"], "mpt: error: unknown --dataset='imagenettx'"),
    (["--logdir={tmp}/a_file/logs"], "mpt: error: cannot create --logdir"),
    (["unexpected"], "mpt: error: unexpected arguments"),
]


def with_tmp(args: list[str], tmp_path) -> list[str]:
  """The arguments, with {tmp} standing for a folder holding a plain file `a_file`."""
  (tmp_path / "a_file").write_text("")
  return [a.format(tmp=tmp_path) for a in args]


# Python's site hook, first on PYTHONPATH: every interpreter started with it (children
# inherit the variable) says it started, and, at its end, whether it loaded TensorFlow.
PROCESS_SPY = """
import atexit, os, sys
def _say(what):
  with open(os.environ["MPT_TEST_PROCESSES"], "a") as f:
    f.write(f"{os.getpid()} {what}\\n")
_say("started")
atexit.register(lambda: _say(f"tensorflow={'tensorflow' in sys.modules}"))
"""


def test_bad_input_is_one_line_and_exit_2_from_a_real_process(tmp_path):
  """On a CPU where TF leaves oneDNN off (the Zen 3's recorded cpuinfo), the run would
  measure both settings in children first: a model name is refuted before any child
  starts, and before TensorFlow loads."""
  args, words = BAD_INPUT[0]
  (tmp_path / "spy").mkdir()
  (tmp_path / "spy" / "sitecustomize.py").write_text(PROCESS_SPY)
  said = tmp_path / "processes.txt"
  env = {**os.environ, "MPT_TEST_PROCESSES": str(said),
         "PYTHONPATH": f"{tmp_path / 'spy'}:{os.environ['PYTHONPATH']}",
         "MPT_CPUINFO": str(ROOT / "tests" / "data" / "cpuinfo" /
                            "amd_epyc_zen3_dev_machine.txt")}
  proc = mpt(f"--data_dir={tmp_path}", f"--logdir={tmp_path}/logs", *args, env=env)
  assert proc.returncode == 2, proc.stderr
  assert error_lines(proc.stderr) == [next(l for l in error_lines(proc.stderr)
                                           if l.startswith("mpt: error:"))]
  assert words in proc.stderr and "Traceback" not in proc.stderr
  pid = said.read_text().split()[0]
  assert said.read_text().splitlines() == [f"{pid} started", f"{pid} tensorflow=False"]


@pytest.mark.parametrize("args,words", BAD_INPUT)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, words):
  code = main_in_process(f"--data_dir={tmp_path}", f"--logdir={tmp_path}/logs",
                         *with_tmp(args, tmp_path))
  err = capsys.readouterr().err
  assert code == 2, err
  assert error_lines(err) == [next(l for l in error_lines(err)
                                   if l.startswith("mpt: error:"))]
  assert words in err and "Traceback" not in err


def test_offline_tfds_is_one_line_and_exit_2(tmp_path, capsys):
  # How it stays fast offline (no network before the prepared-data check) is
  # test_data's; this is what the user sees (what a process of its own prints around
  # it, test_bad_input_is_one_line_and_exit_2_from_a_real_process's).
  code = main_in_process("--dataset=imagenette/320px", f"--data_dir={tmp_path}",
                         f"--logdir={tmp_path}/logs")
  err = capsys.readouterr().err
  assert code == 2 and "not prepared" in err
  [line] = error_lines(err)
  assert line.startswith("mpt: error: TFDS dataset 'imagenette/320px' is not prepared")


def test_ctrl_c_writes_an_interrupted_summary(tmp_path, children):
  """Started as `... &` in a script starts it (nohup, CI runners): SIGINT ignored,
  which the supervisor and its training child inherit; Ctrl-C sent to it still stops
  the run at a step (the next test sends it in a terminal's
  disposition). Also: --onednn=off reaches the training process through the
  supervisor (TF's rewrite is off there on any CPU) and is recorded with the variable
  it set."""
  proc = start_and_wait_for_an_epoch(
      children, tmp_path, "--onednn=off",
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err
  assert "Traceback" not in err
  run = tmp_path / "logs" / "r"
  summary = json.loads((run / "summary.json").read_text())
  assert summary["status"] == "interrupted"
  assert summary["steps"] >= 2 and summary["epochs_completed"] >= 1
  assert len(read_events(run)["train/loss"]) >= summary["epochs_completed"]
  choice = summary["onednn_choice"]
  assert (choice["on"], choice["env"]) == (False, "0")
  assert summary["onednn_choice"]["chosen_by"] == "--onednn"
  assert "mpt: oneDNN's rewrite off: --onednn=off" in out
  assert "--onednn=off" in (run / "flags.txt").read_text().splitlines()


def test_a_second_signal_exits_at_once(tmp_path, children):
  proc = start_and_wait_for_an_epoch(children, tmp_path, "--checkpoint_every=0")
  # Two different signals back to back: Python runs both handlers, where two SIGINTs
  # this close could be merged into one by the kernel.
  proc.send_signal(signal.SIGINT)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err  # 128 + the second signal, as a shell reports it.
  assert "stopping after this step" in err and "second signal, exiting now" in err
  run = tmp_path / "logs" / "r"
  assert not (run / "summary.json").exists()  # It did not wait to write one.


@pytest.mark.parametrize("argv", [["mpt"], [sys.executable, "-m", "mpt.main"],
                                  [sys.executable, "-m", "mpt"]])
def test_help_lists_the_flags_without_importing_tensorflow(argv):
  if argv == ["mpt"] and not shutil.which("mpt"):
    pytest.skip("console script not installed (pip install -e .)")
  # Python lists every import on stderr (PYTHONPROFILEIMPORTTIME): a check that
  # does not depend on how busy the machine is, unlike a time limit.
  proc = subprocess.run(argv + ["--helpshort"], cwd=ROOT, capture_output=True,
                        text=True, timeout=60,
                        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  # A run's flags, and each mode's own, grouped by mode: each under its heading.
  groups, heading = {}, None
  for line in proc.stdout.splitlines():
    if line and not line.startswith(" ") and line.endswith(":"):
      heading = line
    elif line.startswith("  --") and heading:
      groups.setdefault(heading, []).append(line.split(":")[0].strip())
  heads = list(groups)
  assert heads[0].startswith("mpt (python -m mpt") and groups[heads[0]] == ["--mode"]
  where = {flag: head for head, names in groups.items() for flag in names}
  assert where["--policy"].startswith("a training run") and \
      where["--resume"].startswith("a training run")
  assert where["--batch_sizes"] == "--mode=sweep:" and \
      where["--[no]quick"] == "--mode=microbench:"
  assert where["--run"] == "--mode=diagnose:" and where["--runs"] == "--mode=compare:"
  imported = {l.rsplit("|", 1)[-1].strip() for l in proc.stderr.splitlines()
              if l.startswith("import time:")}
  assert "absl.flags" in imported and "mpt.config" in imported
  assert not {m for m in imported if m.split(".")[0] in ("tensorflow", "keras")}


@pytest.mark.parametrize("flagfile", sorted((ROOT / "experiments").glob("*.flags")),
                         ids=lambda p: p.name)
def test_every_experiment_flagfile_replays_as_a_valid_run(flagfile):
  """README's `--flagfile=experiments/*.flags`: each file parses with mpt's flags, each
  mode's options pass their checks, and a sweep expands to the axes the file lists,
  as many cells as its header promises."""
  from mpt import config, main as mpt_main
  from mpt.sweep import run as sweep_run
  from mpt.sweep.options import SweepOptions
  try:
    mpt_main.FLAGS(["mpt", f"--flagfile={flagfile}"])
    mode, opts = mpt_main.FLAGS.mode, mpt_main.options()
  finally:
    mpt_main.FLAGS.unparse_flags()
  for values in opts.values():
    config.validate(values)
  text = flagfile.read_text()
  assert f"--mode={mode}" in text or mode == "train"
  if mode != "sweep":
    return
  cells = sweep_run.cells(opts[config.Config], opts[SweepOptions])
  for name, (field, _) in sweep_run.AXES.items():
    listed = re.search(rf"^--{name}=(.*)$", text, re.M)
    if listed:  # Each listed value is a cell's, as the file spells it.
      assert sorted({str(getattr(c, field)) for c in cells}) == \
          sorted(listed[1].split(",")), name
  said = re.search(r"\((\d+) cells", text)
  assert said is None or len(cells) == int(said[1]), said
