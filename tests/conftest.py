"""The test session's ground rules, and the fixtures shared by several test files.

The suite reads no fact of the host it could get wrong on another machine:
- CPU facts come from a recorded /proc/cpuinfo (`MPT_CPUINFO`), by default the real one
  of an Intel Sapphire Rapids with AMX; `pytest --cpuinfo=NAME` picks another of
  tests/data/cpuinfo/ (`--cpuinfo=host` reads this machine's). Child processes inherit it.
- GPUs are hidden from this process and its children (`CUDA_VISIBLE_DEVICES=""`), so
  every comparison of numerics runs on the CPU whatever the host has; tests marked
  `gpu` run children that see the host's GPUs, and are skipped where there are none.
- mpt's cache (`MPT_CACHE`: generated data, microbenchmark results) is a folder of
  this session, never the user's ~/.cache/mpt.
- The step's cost per policy (mpt/train/before_step1/cost.py) is not measured (`MPT_COST=none`),
  nor each layer's (`MPT_LAYERS=none`, mpt/train/before_step1/layers.py), so
  the kernel table decides as on a machine where it cannot run; tests of the
  measurement set their own stand-in or run it on tiny models.
- The kernel's OOM-kill counters are a file of this session (`MPT_OOM_KILLS`), which
  only an injected `kill` fault counts in: another process of the host being
  OOM-killed cannot turn a test's SIGKILL into an OOM, nor the reverse.
- The memory the preflight takes as available is a fixed 64 GiB stand-in
  (`MPT_AVAILABLE_MB`), never the host's free RAM: a batch-1024 run is not refused on
  a smaller host; tests of the refusal set their own figure.
- The goldens of tests/diagnose/test_golden.py are compared, never rewritten, unless
  `pytest --write-goldens` asks (then each is rewritten and skipped): an
  `MPT_GOLDEN=write` left in the shell cannot turn the comparison into a pass.
- Child processes import this checkout's mpt wherever they run (`PYTHONPATH` starts
  with it), never an mpt installed from another clone.
- After each test the global precision policy is float32 again, op determinism is off
  and os.environ is the session's, whatever the test did; child processes a test
  started are killed.
- The session's cost is printed after pytest's summary: its wall time and the CPU-seconds
  the whole machine spent meanwhile (/proc/stat: the workers, every process they
  started, and anything else running), the figure the suite's budget is counted in.
- What the worker imported (TensorFlow, Keras, mpt, the test modules) is frozen out of
  Python's collections once collection ends (`gc.freeze`), as `python -m mpt.main` does
  for its imports: each later full collection walks only what the tests made. At the
  session's end, what the tests made is frozen too: nothing collects it before exit.
"""

import gc
import os
import pathlib
import shutil
import tempfile
import time

# Before TensorFlow starts: what the host offers, then hide it for the session. The
# original is kept in the environment because pytest-xdist's workers inherit ours.
os.environ.setdefault("MPT_TEST_HOST_CUDA_VISIBLE_DEVICES",
                      os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# (TF_ENABLE_ONEDNN_OPTS is left as it is: =0 runs the suite on TF's Eigen kernels,
# as on a CPU where TF leaves its oneDNN rewrite off.)
for leak in ("MPT_INJECT_FAULT", "TF_CONFIG", "MPT_CPUINFO", "MPT_CACHE",
             "MPT_ONEDNN_CHOICE", "MPT_GOLDEN"):
  os.environ.pop(leak, None)  # A user's setting must not steer the tests.
os.environ["MPT_COST"] = "none"
os.environ["MPT_LAYERS"] = "none"  # Nor each layer's (mpt/train/before_step1/layers.py).
# Room for every run of the suite (the largest, batch 1024 at 32 px, estimates under
# 2 GiB), whatever the host has free.
os.environ["MPT_AVAILABLE_MB"] = str(64 * 1024)
# A child started outside the repository (a user's script in its own folder) would
# otherwise import whichever mpt is installed, and the test check that one.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(pathlib.Path(__file__).resolve().parent.parent)] +
    [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

import pytest

from mpt import config
from mpt import console

with console.without_pyplot():  # As mpt's own processes import them.
  import keras
  import tensorflow as tf

import helpers

# The CPU is split into logical devices for the whole session, before any op runs
# (the only time it can be): the mirrored-strategy tests run in process with
# cpu_devices=CPU_DEVICES. Ops of every other test still run on the first device.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration() for _ in range(helpers.CPU_DEVICES)])

DEFAULT_CPUINFO = "intel_spr_amx_recorded.txt"
# The kernel table recorded on the same machine as a cpuinfo fixture; for the others
# nothing is measured (MPT_KERNELS=none): the CPU flags decide, as they would there.
KERNELS_OF = {"intel_spr_amx_recorded.txt": "intel_spr_amx_recorded.json",
              "amd_epyc_zen4_dev_machine.txt": "amd_epyc_zen4_recorded.json"}


_STARTED = pytest.StashKey[tuple]()


def pytest_addoption(parser):
  parser.addoption(
      "--cpuinfo", default=DEFAULT_CPUINFO,
      help="the recorded /proc/cpuinfo that stands in for the host's during the run "
           f"(one of {', '.join(helpers.CPUINFO_FIXTURES)}), or 'host' for the real one")
  parser.addoption(
      "--write-goldens", action="store_true",
      help="rewrite tests/data/golden/*.txt from the diagnosis as it is now (each "
           "golden test then skips: read the diff before committing it)")


def pytest_configure(config):
  choice = config.getoption("cpuinfo")
  if choice != "host":
    path = helpers.CPUINFO / choice
    if not path.is_file():
      raise pytest.UsageError(f"--cpuinfo={choice}: no such file in {helpers.CPUINFO}; "
                              f"one of {', '.join(helpers.CPUINFO_FIXTURES)} or 'host'")
    os.environ["MPT_CPUINFO"] = str(path)
    kernels = KERNELS_OF.get(choice)
    os.environ["MPT_KERNELS"] = str(helpers.DATA / "kernels" / kernels) if kernels \
        else "none"
  cache = tempfile.mkdtemp(prefix="mpt-test-cache-")
  os.environ["MPT_CACHE"] = cache
  counters = pathlib.Path(cache) / "oom_kills"
  counters.write_text("oom_kill 0\n")
  os.environ["MPT_OOM_KILLS"] = str(counters)
  config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))
  if config.getoption("write_goldens"):  # The only way in: the import popped it.
    os.environ["MPT_GOLDEN"] = "write"


def _cpu_seconds() -> float | None:
  """The CPU-seconds the machine has spent since boot (user, nice, system, irq,
  softirq: not idle or iowait), from /proc/stat; None where there is none."""
  try:
    fields = pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()
  except OSError:
    return None
  return sum(int(fields[i]) for i in (1, 2, 3, 6, 7)) / os.sysconf("SC_CLK_TCK")


def pytest_sessionstart(session):
  session.config.stash[_STARTED] = (time.perf_counter(), _cpu_seconds())


def pytest_terminal_summary(terminalreporter, config):
  if hasattr(config, "workerinput") or _STARTED not in config.stash:
    return  # A pytest-xdist worker: the controller says it for the session.
  wall0, cpu0 = config.stash[_STARTED]
  cpu1 = _cpu_seconds()
  cpu = f"{cpu1 - cpu0:,.0f} CPU-seconds machine-wide (/proc/stat)" \
      if cpu0 is not None and cpu1 is not None else "CPU-seconds unknown (no /proc/stat)"
  terminalreporter.write_line(f"mpt: the suite took {time.perf_counter() - wall0:,.0f} s "
                              f"wall, {cpu} on {os.cpu_count()} CPUs")


def pytest_report_header(config):
  return (f"mpt: CPU facts from {os.environ.get('MPT_CPUINFO', '/proc/cpuinfo (host)')}"
          f"; kernel table from {os.environ.get('MPT_KERNELS', 'a probe of the host')}")


def pytest_collection_finish(session):
  # Unfrozen, each full collection of a worker walks everything TensorFlow and the test
  # modules made at import, whatever the test made since: frozen, test_train,
  # test_guards and test_models together took 9% less CPU (one process, Zen 4).
  gc.freeze()


def pytest_sessionfinish(session, exitstatus):
  # pytest then collects five times over (its search for unraisable exceptions in
  # finalizers: 3.8 s on one worker, profiled) and the interpreter once more at exit,
  # each over every graph and model the session made, which are not garbage to find.
  gc.freeze()


def _host_has_gpu() -> bool:
  """An NVIDIA driver, devices not hidden by the user, and a TensorFlow built for CUDA."""
  host = os.environ["MPT_TEST_HOST_CUDA_VISIBLE_DEVICES"]
  if host in ("", "-1") or not (shutil.which("nvidia-smi") or
                                pathlib.Path("/dev/nvidia0").exists()):
    return False
  return tf.test.is_built_with_cuda()


def pytest_collection_modifyitems(config, items):
  if _host_has_gpu():
    return
  skip = pytest.mark.skip(reason="no NVIDIA GPU for a CUDA TensorFlow on this host")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


@pytest.fixture(autouse=True)
def _reset_global_state():
  """Each test starts as a fresh process would: float32, no op determinism, and the
  session's environment (a script a test imports by path may set a variable, e.g.
  experiments/gpu_jax_captures.py's KERAS_BACKEND=jax, that every later child process
  of the worker would inherit)."""
  environ = dict(os.environ)
  yield
  if os.environ != environ:
    os.environ.clear()
    os.environ.update(environ)
  keras.mixed_precision.set_global_policy("float32")
  # Written for TF 2.21: TensorFlow has no public switch back (tf.config.experimental
  # has only enable_op_determinism); without this, a --deterministic run would leave
  # every later test of its worker deterministic.
  from tensorflow.python.framework import config as tf_config
  tf_config.disable_op_determinism()
  assert not tf_config.is_op_determinism_enabled()


@pytest.fixture
def children():
  """Starts child processes (`children.start(argv, ...)`) killed when the test ends."""
  kids = helpers.Children()
  yield kids
  kids.close()


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> pathlib.Path:
  """One synthetic-data cache for the whole session (generated on first use)."""
  return tmp_path_factory.mktemp("data")


@pytest.fixture
def tiny(tmp_path, data_dir):
  """Returns a factory of Configs that train for seconds: 16 px, 64 images, batch 8
  (float16 convolutions on a Sapphire Rapids run oneDNN's reference kernels: at 32 px
  one run of them took 16 s, at 16 px 6 s)."""
  def make(**overrides) -> config.Config:
    values = dict(image_size=16, batch_size=8, epochs=3, synthetic_train=64,
                  synthetic_val=32, synthetic_px=40, warmup_steps=2, verbose=0,
                  learning_rate=3e-3, logdir=str(tmp_path / "logs"),
                  data_dir=str(data_dir))
    values.update(overrides)
    return config.Config(**values)
  return make
