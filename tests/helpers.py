"""What several test files share: the repository's paths, tiny command lines, child
processes that never outlive their test, and TensorBoard events read back from disk.

Fixtures live in conftest.py; plain functions and classes live here, so that a test
imports them by name instead of from conftest.
"""

import gc
import importlib.util
import multiprocessing
import os
import pathlib
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def gpu_captures() -> pathlib.Path:
  """tests/data/gpu_captures as the tests read it: the captures over 1 MB are stored
  gzipped (`*.xplane.pb.gz`, byte for byte the same once expanded: the README's
  sha256 are the expanded files'), so they are expanded, once per process, into a
  temporary copy of the folder."""
  global _GPU_CAPTURES
  if _GPU_CAPTURES is None:
    import atexit
    import gzip
    import shutil
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="mpt-gpu-captures-"))
    atexit.register(shutil.rmtree, tmp, True)
    shutil.copytree(DATA / "gpu_captures", tmp / "gpu_captures",
                    ignore=shutil.ignore_patterns("*.gz"))
    for packed in (DATA / "gpu_captures").rglob("*.xplane.pb.gz"):
      out = tmp / "gpu_captures" / packed.relative_to(DATA / "gpu_captures")
      out.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
    _GPU_CAPTURES = tmp / "gpu_captures"
  return _GPU_CAPTURES


_GPU_CAPTURES = None
CPUINFO = DATA / "cpuinfo"
# Every /proc/cpuinfo the suite can stand in for the host (`pytest --cpuinfo=NAME`).
CPUINFO_FIXTURES = sorted(p.name for p in CPUINFO.glob("*.txt"))

# The CPU is split into this many logical devices for the whole session (conftest.py).
CPU_DEVICES = 2

# The tiny run of the command-line tests: 16 px, 20 images, batch 4.
TINY_FLAGS = ["--image_size=16", "--batch_size=4", "--synthetic_train=20",
              "--synthetic_val=10", "--synthetic_px=20", "--verbose=0"]


# An inspection report as --mode=inspect records it, for the memory estimate's tests
# (tests/measure/test_memory.py, tests/train/before_step1/test_preflight.py). Under mixed_bfloat16:
# 100 bfloat16 outputs, then 10 forced to float32.
SMALL_REPORT = {
    "params": 1000, "input_shape": [8, 8, 3], "policy": "mixed_bfloat16",
    "layers": [{"output_elements": 100, "output_dtype": "bfloat16",
                "float32_reason": None},
               {"output_elements": 10, "output_dtype": "float32",
                "float32_reason": "dtype forced to float32 (numerically sensitive)"}]}

# A user's custom layer with weights and ops of its own (whose FLOPs mpt cannot see),
# for the scripts and modules the tests write as a user would.
USER_SCALE_LAYER = """
class Scale(keras.layers.Layer):
  def build(self, shape):
    self.w = self.add_weight(shape=(shape[-1],), initializer="ones")

  def call(self, x):
    return x * keras.ops.cast(self.w, x.dtype)
"""


def read_events(run_dir) -> dict[str, list[tuple[int, object]]]:
  """{tag: [(step, value), ...]} of every summary in run_dir's event files.

  Scalars come back as floats, text summaries as str.
  """
  import tensorflow as tf
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(
      str(run_dir), size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  decode = lambda v: v.decode() if isinstance(v, bytes) else float(v)
  events = {}
  for tag in acc.Tags()["tensors"]:
    values = [(e.step, tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
    if all(v.size == 1 for _, v in values):  # Not HParams' empty marker tensors.
      events[tag] = [(step, decode(v.item())) for step, v in values]
  return events


def read_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
  return {tag: values for tag, values in read_events(run_dir).items()
          if values and isinstance(values[0][1], float)}


def trace_steps(xplane) -> list[tuple[str, dict]]:
  """(name, stats) of every event of an xplane.pb trace carrying a `step_num` stat:
  the step markers the profile plugin groups a trace's steps by."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # TF's copy of the proto.
  space = xplane_pb2.XSpace()
  space.ParseFromString(pathlib.Path(xplane).read_bytes())
  found = []
  for plane in space.planes:
    for line in plane.lines:
      for event in line.events:
        stats = {plane.stat_metadata[s.metadata_id].name:
                 s.int64_value or s.uint64_value or s.str_value for s in event.stats}
        if "step_num" in stats:
          found.append((plane.event_metadata[event.metadata_id].name, stats))
  return found


def tiny_flags(tmp_path, *flags: str) -> list[str]:
  """mpt's flags for training in seconds on tiny data under tmp_path."""
  return [*TINY_FLAGS, f"--data_dir={tmp_path}", f"--logdir={tmp_path}/logs", *flags]


def tiny_cli(tmp_path, *flags: str) -> list[str]:
  """argv of `python -m mpt.main` training in seconds on tiny data under tmp_path."""
  return [sys.executable, "-m", "mpt.main", *tiny_flags(tmp_path, *flags)]


def mpt(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
  """Runs `python -m mpt.main ARGS` from the repository to its end."""
  return subprocess.run([sys.executable, "-m", "mpt.main", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout, **kwargs)


_FORKSERVER = None  # This pytest process's, started at the first forked run.
# What the fork server imports once (tests/forkserver_preload.py, found from the
# repository root on PYTHONPATH: the server does not take pytest's sys.path), so that a
# run forked from it starts at mpt's first line of work instead of TensorFlow's import.
PRELOAD = ["tests.forkserver_preload"]


def _forked_main(argv: list[str], env: dict[str, str], out: str, err: str) -> None:
  """A forked child: the environment, cwd and output files of a fresh process, then
  mpt's command line (absl's app.run, as `python -m mpt.main` runs it)."""
  gc.freeze()  # The server's imports, out of the child's collections (as mpt/main.py).
  os.environ.update(env)
  tempfile.tempdir = None  # TMPDIR read again, as a fresh process would.
  os.chdir(ROOT)
  for fd, path in ((1, out), (2, err)):
    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
  from absl import app
  from mpt import main
  app.run(main.main, argv=["mpt", *argv])


def _forked_script(argv: list[str], env: dict[str, str], out: str, err: str,
                   cwd: str) -> None:
  """A forked child running a Python script as `python SCRIPT ARGS` would, in `cwd`
  (`env`: variables to set; None unsets one)."""
  gc.freeze()  # As in _forked_main.
  for name, value in env.items():
    os.environ.pop(name, None) if value is None else os.environ.update({name: value})
  tempfile.tempdir = None
  os.chdir(cwd)
  for fd, path in ((1, out), (2, err)):
    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
  sys.argv = list(argv)
  sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
  try:
    runpy.run_path(argv[0], run_name="__main__")
  except SystemExit as e:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(e.code if isinstance(e.code, int) else (0 if e.code is None else 1))
  sys.stdout.flush()
  sys.stderr.flush()


class Forked:
  """A running `python -m mpt.main ARGS` forked from the server (mpt_forked_start),
  or `python SCRIPT ARGS` (script_forked)."""

  def __init__(self, args: tuple[str, ...], env: dict[str, str],
               script_cwd: str | None = None):
    global _FORKSERVER
    if _FORKSERVER is None:
      _FORKSERVER = multiprocessing.get_context("forkserver")
      _FORKSERVER.set_forkserver_preload(PRELOAD)
    self.args = ["mpt", *args] if script_cwd is None else list(args)
    self._tmp = tempfile.TemporaryDirectory()
    self._out, self._err = f"{self._tmp.name}/stdout", f"{self._tmp.name}/stderr"
    target, extra = ((_forked_main, ()) if script_cwd is None else
                     (_forked_script, (script_cwd,)))
    self._proc = _FORKSERVER.Process(target=target,
                                     args=(list(args), env, self._out, self._err,
                                           *extra))
    self._proc.start()
    self.pid = self._proc.pid

  def poll(self) -> int | None:
    return self._proc.exitcode

  def kill(self) -> None:
    if self._proc.exitcode is None:
      self._proc.kill()
      self._proc.join()

  def wait(self, timeout: float = 300) -> subprocess.CompletedProcess:
    """Its exit status and output once it ended (killed after `timeout` seconds)."""
    self._proc.join(timeout)
    if self._proc.exitcode is None:
      self.kill()
      raise subprocess.TimeoutExpired(self.args, timeout)
    read = lambda path: pathlib.Path(path).read_text() if os.path.exists(path) else ""
    done = subprocess.CompletedProcess(self.args, self._proc.exitcode, read(self._out),
                                       read(self._err))
    self._tmp.cleanup()
    return done


def mpt_forked_start(*args: str, env: dict[str, str] | None = None) -> Forked:
  """Starts `python -m mpt.main ARGS` in a process forked from a server that has
  imported TensorFlow and mpt but run no op (see mpt_forked); returns at once."""
  return Forked(args, env or {})


def mpt_forked(*args: str, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
  """`python -m mpt.main ARGS` in a process forked from a server that has imported
  TensorFlow and mpt but run no op: a process of its own (its own memory, pid, exit
  status, death by signal) that skips the import. The differences from the command
  line: training runs in it directly (no watching parent, mpt/supervisor.py), and
  variables TensorFlow reads at import (TF_CPP_MIN_LOG_LEVEL, ONEDNN_*) have the
  server's values; `env` adds those read later (MPT_*, TF_CONFIG, XLA_FLAGS)."""
  return mpt_forked_start(*args, env=env).wait(timeout)


def script_forked(script, *args: str, cwd, env: dict[str, str | None] | None = None,
                  timeout: float = 400) -> subprocess.CompletedProcess:
  """`python SCRIPT ARGS` in `cwd`, forked from the server that imported TensorFlow
  and mpt once (mpt_forked): for a script whose own process start is not under test
  (`env`: variables to set, None to unset one)."""
  return Forked((str(script), *args), env or {}, script_cwd=str(cwd)).wait(timeout)


def wait_for(condition: Callable[[], bool], timeout: float, every: float = 0.2) -> bool:
  """Polls `condition` until it holds or `timeout` seconds pass; returns whether it held."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if condition():
      return True
    time.sleep(every)
  return condition()


class Children:
  """Child processes started by one test; `close()` kills those still running.

  Each child leads its own process group, so a sweep's cell dies with the sweep.
  """

  def __init__(self):
    self.procs: list[subprocess.Popen] = []

  def start(self, argv: list[str], **kwargs) -> subprocess.Popen:
    kwargs.setdefault("cwd", ROOT)
    kwargs.setdefault("text", True)
    kwargs.setdefault("start_new_session", True)
    proc = subprocess.Popen(argv, **kwargs)
    self.procs.append(proc)
    return proc

  def close(self) -> None:
    for proc in self.procs:
      # The whole group (a sweep's cells too), while the leader is not yet reaped:
      # until then its pid, and so the group id, cannot be another process's.
      if proc.returncode is None:
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        proc.communicate()


def start_and_wait_for_an_epoch(children: Children, tmp_path, *flags: str,
                                timeout: float = 120, preexec_fn=None) -> subprocess.Popen:
  """Starts a long tiny run named `r`; returns once its first epoch is in the events."""
  proc = children.start(
      tiny_cli(tmp_path, "--epochs=1000", "--steps_per_epoch=2", "--run_name=r", *flags),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=preexec_fn)
  run = tmp_path / "logs" / "r"
  seen = wait_for(lambda: run.exists() and "train/loss" in read_events(run), timeout)
  assert seen, f"no epoch in {timeout} s (exit status {proc.poll()})"
  return proc


def train_run(cfg):
  """One training run in this process as `python -m mpt.main` runs it (mpt/main.py):
  training, then the diagnosis of its folder as the after-run step."""
  from mpt.diagnose import diagnosis
  from mpt.train.cli import run
  return run.train_and_evaluate(cfg, after_run=diagnosis.after_run)


def _benchlib():
  """experiments/benchlib.py, imported by path (no lasting sys.path entry)."""
  spec = importlib.util.spec_from_file_location("benchlib",
                                                ROOT / "experiments" / "benchlib.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# TF_CONFIG values for a cluster of local worker processes: the benchmarks' own.
local_cluster = _benchlib().local_cluster
