"""Utilisation sampled in a background thread while a run trains.

Every `period_s` seconds: this process's CPU % (100 = one core busy), the whole
system's CPU % (100 = all cores busy) and the process's resident memory (psutil); with
an NVIDIA GPU also GPU utilisation % and memory used (NVML, from nvidia-ml-py) and
TensorFlow's peak device memory. Samples wait in a buffer that the main thread drains
when it writes TensorBoard scalars, so only one thread ever touches the event writer.

Absent figures are not errors: without a GPU, without nvidia-ml-py or without a
driver, the sampler records what it can and says once why GPU figures are absent. A
failing sample is logged once and skipped; it never stops training.
"""

import os
import statistics
import threading
from typing import Any

from absl import logging
import psutil
import tensorflow as tf

from mpt.machine import cores
from mpt.records import typed
from mpt.records.machine import Utilisation


FROM_ENV = object()  # Sampler's `visible` default: CUDA_VISIBLE_DEVICES as set.


def _handles(nvml: Any, visible: str | None) -> list:
  """NVML's handles of the GPUs this process uses. NVML ignores CUDA_VISIBLE_DEVICES
  and counts every GPU of the machine, so its entries are mapped here: a UUID
  ("GPU-...", "MIG-...") by UUID, an index by index (NVML numbers GPUs in PCI bus
  order, as CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's default puts the
  fastest first, which differs only on a machine of mixed GPUs). `visible` None: all."""
  if visible is None:
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
  return [nvml.nvmlDeviceGetHandleByIndex(int(e)) if e.isdigit()
          else nvml.nvmlDeviceGetHandleByUUID(e)
          for e in (e.strip() for e in visible.split(",")) if e]


def _open_nvml(nvml: Any | None,
               visible: str | None) -> tuple[Any | None, list, str | None]:
  """(nvml module, the handles of the GPUs this process uses, why GPU figures are
  absent or None)."""
  if nvml is None:
    if not tf.config.list_physical_devices("GPU"):
      return None, [], "no GPU visible to TensorFlow"
    try:
      import pynvml as nvml  # Provided by nvidia-ml-py.
    except ImportError:
      return None, [], "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
  try:
    nvml.nvmlInit()
    handles = _handles(nvml, visible)
  except Exception as e:  # NVML raises its own error types; any of them means absent.
    return None, [], f"NVML unavailable: {e}"
  if not handles:  # Nothing to sample (and no mean of no GPUs).
    return None, [], "NVML sees no GPU this process uses"
  return nvml, handles, None


class Sampler:
  """Samples utilisation every `period_s` seconds in a daemon thread."""

  def __init__(self, period_s: float = 1.0, nvml: Any | None = None,
               state: dict[str, list[float]] | None = None, visible=FROM_ENV):
    """`state`: a resumed run's `state()` when its checkpoint was written, so that the
    whole-run figures cover the run before the resume as well. `visible`: the GPUs
    this process uses, as CUDA_VISIBLE_DEVICES lists them (None: all)."""
    self.period_s = period_s
    self._process = psutil.Process()
    self._cpus = cores.affinity()
    if visible is FROM_ENV:
      visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    self._nvml, self._handles, self.gpu_absent = _open_nvml(nvml, visible)
    self._tf_gpu = bool(tf.config.list_physical_devices("GPU"))
    self._buffer: list[dict[str, float]] = []
    # The whole run's figures as running [count, sum, max] per figure: bounded
    # however long the run, and small enough for every checkpoint's state.
    self._totals: dict[str, list[float]] = {k: list(v) for k, v in (state or {}).items()}
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="mpt-sampler", daemon=True)
    self._failed = False
    if self.gpu_absent:
      logging.info("GPU utilisation not sampled: %s", self.gpu_absent)

  def sample(self) -> dict[str, float]:
    """One reading of every available figure."""
    per_cpu = psutil.cpu_percent(None, percpu=True)
    mine = [per_cpu[i] for i in self._cpus if i < len(per_cpu)] or per_cpu
    s = {"process_cpu_percent": self._process.cpu_percent(None),
         # Over the CPUs this process may use (a cpuset), not the host's.
         "system_cpu_percent": statistics.fmean(mine),
         "rss_mb": self._process.memory_info().rss / 2**20}
    if self._nvml:
      util = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
      mem = [self._nvml.nvmlDeviceGetMemoryInfo(h).used for h in self._handles]
      s["gpu_percent"] = float(statistics.fmean(util))
      s["gpu_memory_mb"] = sum(mem) / 2**20
    if self._tf_gpu:
      s["tf_peak_memory_mb"] = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return s

  def _run(self) -> None:
    while not self._stop.wait(self.period_s):
      try:
        s = self.sample()
      except Exception as e:  # Never let a sampling fault reach training.
        if not self._failed:
          logging.warning("utilisation sampling failed (continuing without it): %s", e)
          self._failed = True
        continue
      with self._lock:
        self._buffer.append(s)
        for k, v in s.items():
          count, total, peak = self._totals.get(k, (0, 0.0, v))
          self._totals[k] = [count + 1, total + v, max(peak, v)]

  def start(self) -> "Sampler":
    """Starts sampling; again after `stop()` (a second `fit` of one run), the figures
    continuing."""
    if self._thread.is_alive():
      return self
    if self._thread.ident is not None:  # Ran before: a thread starts only once.
      self._stop.clear()
      self._thread = threading.Thread(target=self._run, name="mpt-sampler", daemon=True)
    self._process.cpu_percent(None)  # The first reading only sets the baseline.
    psutil.cpu_percent(None, percpu=True)
    self._thread.start()
    return self

  def stop(self) -> None:
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join(timeout=5 * self.period_s + 1)

  def drain(self) -> dict[str, float]:
    """Mean of each figure over the samples taken since the last drain."""
    with self._lock:
      samples, self._buffer = self._buffer, []
    keys = {k for s in samples for k in s}
    return {k: statistics.fmean(s[k] for s in samples if k in s) for k in keys}

  def state(self) -> dict[str, list[float]]:
    with self._lock:
      return {k: list(v) for k, v in self._totals.items()}

  def stats(self) -> Utilisation:
    """Each figure's mean and max over the whole run (summary.json `util`)."""
    return typed.from_dict(Utilisation, {
        k: {"mean": total / count, "max": peak}
        for k, (count, total, peak) in sorted(self.state().items())})
