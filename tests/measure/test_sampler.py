"""Utilisation sampler: CPU figures here, GPU figures through a fake NVML, faults."""

import dataclasses
import types

import pytest

from helpers import wait_for
from mpt.measure import sampler as sampler_lib
from mpt.records import typed
from mpt.records.machine import Utilisation


class FakeNvml:
  """Just enough of pynvml for two GPUs."""

  def __init__(self, fail_init=False):
    self.fail_init = fail_init

  def nvmlInit(self):
    if self.fail_init:
      raise RuntimeError("NVML Shared Library Not Found")

  def nvmlDeviceGetCount(self):
    return 2

  def nvmlDeviceGetHandleByIndex(self, i):
    return i

  def nvmlDeviceGetHandleByUUID(self, uuid):
    return {"GPU-aaa": 0, "GPU-bbb": 1}[uuid]

  def nvmlDeviceGetUtilizationRates(self, handle):
    return types.SimpleNamespace(gpu=[40, 80][handle])

  def nvmlDeviceGetMemoryInfo(self, handle):
    return types.SimpleNamespace(used=2**30)


def test_cpu_figures_and_why_gpu_figures_are_absent():
  # GPUs are hidden from the test session (conftest.py), whatever the host has.
  s = sampler_lib.Sampler(period_s=0.05).start()
  sum(range(3_000_000))  # Some work to sample.
  # Two samples at least (the state's running count), however late a busy machine
  # schedules the sampler's thread.
  assert wait_for(lambda: s.state().get("rss_mb", [0])[0] >= 2, timeout=30)
  s.stop()
  assert s.gpu_absent == "no GPU visible to TensorFlow"
  stats = s.stats()
  assert {k for k, v in dataclasses.asdict(stats).items() if v} == {
      "process_cpu_percent", "system_cpu_percent", "rss_mb"}
  assert stats.rss_mb.max >= stats.rss_mb.mean > 10
  assert 0 <= stats.system_cpu_percent.mean <= 100


@pytest.mark.parametrize("visible,percent", [
    (None, 60), ("1", 80), ("GPU-bbb,GPU-aaa", 60), ("GPU-aaa", 40), ("0,", 40),
    ("", None)])
def test_nvml_samples_only_the_gpus_this_process_uses(visible, percent):
  """NVML counts every GPU of the machine whatever CUDA_VISIBLE_DEVICES says: the
  sampler maps the variable's indices and UUIDs to NVML's handles (the fake's GPU 0
  is 40% busy, GPU 1 80%)."""
  s = sampler_lib.Sampler(nvml=FakeNvml(), visible=visible)
  assert s.sample().get("gpu_percent") == percent
  assert (s.gpu_absent == "NVML sees no GPU this process uses") is (percent is None)


def test_gpu_figures_come_from_nvml():
  s = sampler_lib.Sampler(period_s=0.05, nvml=FakeNvml(), visible=None)
  assert s.gpu_absent is None
  sample = s.sample()
  assert sample["gpu_percent"] == 60 and sample["gpu_memory_mb"] == 2048
  # Every figure it samples has its field in summary.json's `util` record: a figure
  # renamed on one side only would be dropped there, and read back as None.
  unknown = []
  typed.from_dict(Utilisation, {k: {"mean": v, "max": v} for k, v in sample.items()},
                  unknown)
  assert unknown == []


def test_nvml_failure_is_reported_not_raised():
  s = sampler_lib.Sampler(nvml=FakeNvml(fail_init=True), visible=None)
  assert s.gpu_absent == "NVML unavailable: NVML Shared Library Not Found"
  assert "gpu_percent" not in s.sample()


def test_a_failing_sample_never_stops_the_thread(monkeypatch):
  s = sampler_lib.Sampler(period_s=0.02)
  calls = []

  def broken():
    calls.append(1)
    raise OSError("psutil went away")
  monkeypatch.setattr(s, "sample", broken)
  s.start()
  assert wait_for(lambda: len(calls) > 2, timeout=30)  # It went on after the first.
  s.stop()
  assert s.stats() == Utilisation() and s.drain() == {}
