"""What mpt prints on the terminal, beside its one-line errors: the quiet defaults of
TensorFlow's and absl's logging, and progress for the slow phases that would
otherwise be silent (data generation, the cache fill, microbenchmark sections, sweep
cells); which of TensorFlow's stderr lines reach the user (`StartupFilter`, applied at
its import and by the supervisor to a training child's stderr).

A phase shows Keras' progress bar on a terminal and two plain lines (start, end with
its duration) when the output goes to a file or a pipe, where an animated bar would
leave escape codes.
Nothing here imports TensorFlow.
"""

import contextlib
import os
import re
import subprocess
import sys
import time
import types


def keras_verbose(verbose: int) -> int:
  """--verbose for Keras' own progress: off when the output is not a terminal and the
  default bar (1) was asked for; `epoch_lines` prints a line per epoch instead."""
  return 0 if verbose == 1 and not sys.stdout.isatty() else verbose


def epoch_lines(verbose: int, epochs: int, median_ms):
  """A callback printing one line per epoch when the output is not a terminal (and
  --verbose is the default 1), or None. `median_ms(n)`: the median time of the last
  n steps."""
  if verbose != 1 or sys.stdout.isatty():
    return None
  import keras

  class EpochLines(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
      self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
      self.steps += 1

    def on_epoch_end(self, epoch, logs=None):
      figures = ", ".join(f"{k} {v:.4g}" for k, v in (logs or {}).items()
                          if isinstance(v, (int, float)))
      print(f"mpt: epoch {epoch + 1}/{epochs}: {self.steps} steps, "
            f"{median_ms(self.steps):.1f} ms/step, {figures}", flush=True)

  return EpochLines()


def quiet_tensorflow() -> None:
  """TF's C++ INFO lines off unless the user chose a level; call before importing TF."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def keras_on_tensorflow() -> str | None:
  """Keras' TensorFlow backend for this process and its children (mpt trains, times and
  profiles TensorFlow's step); call before Keras is imported. Returns a note when the
  user's KERAS_BACKEND chose another (the variable overrides keras.json)."""
  chosen = os.environ.get("KERAS_BACKEND", "")
  os.environ["KERAS_BACKEND"] = "tensorflow"
  if chosen and chosen != "tensorflow":
    return (f"mpt: note: KERAS_BACKEND={chosen} ignored: mpt measures TensorFlow, so its "
            "own processes use Keras' TensorFlow backend")
  return None


# A C++ log line of absl's format: `I1203 12:00:00.123456 ...` (TF's own start-up lines
# carry `I0000 00:00:...`: they are written before its log level is read), and absl's
# notice that this is so, which TF's two native libraries print once each.
_LOG_LINE = re.compile(rb"^[IWEF]\d{4} ")
_INFO_LINE = re.compile(rb"^(I\d{4} |WARNING: All log messages before absl::InitializeLog)")
# CUDA's probe on a host with TF's CUDA libraries and no driver: an `E` line that is no
# error of the run's; mpt says it once, in its own words.
_NO_DRIVER = re.compile(rb"cuda_platform\.cc:\d+\] failed call to cuInit")
# An INFO line's continuation: the CPU-feature guard's second line. Any other line
# begins a record of its own (the supervisor's filter reads the whole run's stderr:
# mpt's lines, a crash's last words, Python's tracebacks).
_CONTINUATION = re.compile(rb"^To enable the following instructions")
NO_GPU = ("mpt: no GPU used: TensorFlow's CUDA libraries are installed, but no NVIDIA "
          "driver answered (cuInit failed); training runs on the CPU")


class StartupFilter:
  """Which lines of TensorFlow's stderr to pass on: all but its start-up INFO notices
  (with their continuation line: the CPU-feature guard's "To enable the following
  instructions ...") and the no-driver cuInit line (`no_driver` records that it came)."""

  def __init__(self):
    self.in_info, self.no_driver = False, False

  def keep(self, line: bytes) -> bool:
    if _NO_DRIVER.search(line):
      self.no_driver, self.in_info = True, False
      return False
    if _LOG_LINE.match(line) or line.startswith(b"WARNING: All log messages"):
      self.in_info = bool(_INFO_LINE.match(line))
      return not self.in_info
    self.in_info = self.in_info and bool(_CONTINUATION.match(line))
    return not self.in_info  # A continuation line belongs to the line before.


def filter_stream() -> None:
  """The filter process of `import_tensorflow`: stdin's lines passed on to fd 2 as
  they come; at the end `no_driver` on stdout if the cuInit line came."""
  found = StartupFilter()
  for line in iter(sys.stdin.buffer.readline, b""):
    if found.keep(line):
      os.write(2, line)
  sys.stdout.write("no_driver" if found.no_driver else "")


@contextlib.contextmanager
def without_pyplot():
  """A block importing TensorFlow as on a machine without matplotlib, which imports
  again afterwards (mpt's own charts). TF imports Keras, whose visualization module
  imports pyplot where it can (Keras 3.15, in a try/except ImportError: matplotlib is
  optional for Keras); mpt never plots through Keras, and that import was 0.7 of TF's
  4 CPU-s (Zen 4, TF 2.21), paid by every run, sweep cell and probe child."""
  if "matplotlib" in sys.modules:  # A process that has it (a user's) keeps it.
    yield
    return
  sys.modules["matplotlib"] = None  # An import of it, or of a submodule, fails.
  try:
    yield
  finally:
    if sys.modules.get("matplotlib", 0) is None:
      del sys.modules["matplotlib"]


def import_tensorflow(say_no_gpu: bool = True, parent_filters: bool = False) -> None:
  """Imports TensorFlow and lets it look for GPUs, its start-up INFO lines (oneDNN, CUDA
  stubs, CPU features) dropped and the no-driver cuInit line said once as NO_GPU.
  `parent_filters`: a supervised training child, whose stderr its parent already reads
  through the same filter and which says NO_GPU itself (mpt/supervisor.py): TensorFlow
  is imported directly, with no filter process of its own. TF 2.21 prints those lines
  while importing, before TF_CPP_MIN_LOG_LEVEL applies, so the level alone cannot hide
  them.
  The lines go through a filter *process* as they are written: everything else is passed
  on at once, and what TF writes just before an abort (its CPU-feature guard: "compiled
  to use X instructions, but these aren't available") still reaches the terminal after
  this process is gone. With TF_CPP_MIN_LOG_LEVEL=0 (the user asked for INFO) nothing is
  dropped."""
  if ("tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0"
      or parent_filters):
    with without_pyplot():
      import tensorflow as tf
    if parent_filters:
      tf.config.list_physical_devices("GPU")  # Its cuInit line, for the parent.
    return
  sys.stderr.flush()
  filt = subprocess.Popen([sys.executable, "-c",
                           "import mpt.console as c; c.filter_stream()"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
  saved = os.dup(2)
  os.dup2(filt.stdin.fileno(), 2)
  try:
    with without_pyplot():
      import tensorflow as tf
    tf.config.list_physical_devices("GPU")  # CUDA's probe: its cuInit line, here.
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    filt.stdin.close()
    said = filt.stdout.read()
    filt.wait()
  if b"no_driver" in said and say_no_gpu:  # A mode that would use one says so.
    print(NO_GPU, flush=True)


def quiet_absl(verbosity_given: bool) -> None:
  """absl (and the TF Python code logging through it: checkpoint sharding, traced
  all-reduces) at WARNING, unless -v/--verbosity was given."""
  import logging as std_logging
  from absl import logging
  if not verbosity_given:
    logging.set_verbosity(logging.WARNING)
  # TF's Python logger: its own INFO lines drown mpt's; warnings still show.
  std_logging.getLogger("tensorflow").setLevel(std_logging.WARNING)


@contextlib.contextmanager
def phase(label: str, total: int | None = None, unit: str = "step"):
  """Progress of one phase: `with phase("filling the cache", 1300, "image") as p: ...
  p.update(n)` as work completes. Off a terminal, one line: the label when the phase
  starts, `done in N s` appended when it ends."""
  start, bar = time.perf_counter(), None
  if sys.stdout.isatty() and total:
    import keras  # Only on a terminal, where the bar is drawn.
    print(f"mpt: {label}", flush=True)
    bar = keras.utils.Progbar(total, unit_name=unit)
  else:
    print(f"mpt: {label} ...", end="", flush=True)
  yield types.SimpleNamespace(update=lambda done: bar and bar.update(min(done, total)))
  took = time.perf_counter() - start
  if bar:
    bar.update(total, finalize=True)
    print(f"mpt: {label}: done in {took:.1f} s", flush=True)
  else:
    print(f" done in {took:.1f} s", flush=True)


def eta(done: int, total: int, elapsed: float) -> str:
  """`~3 min left` from the mean time per item so far ('' before the first)."""
  if not done or done >= total:
    return ""
  left = elapsed / done * (total - done)
  return f"~{left / 60:.0f} min left" if left >= 90 else f"~{left:.0f} s left"
