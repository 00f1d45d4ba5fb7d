"""Where mpt's CPU facts come from, and the peak and device name built on them (the
per-cycle rule itself: test_microbench)."""

import os
import pathlib

import pytest

from mpt.machine import hardware
from mpt.machine import isa

from helpers import CPUINFO, CPUINFO_FIXTURES


@pytest.mark.parametrize("name", CPUINFO_FIXTURES)
def test_mpt_cpuinfo_stands_in_for_the_host(monkeypatch, name):
  path = CPUINFO / name
  monkeypatch.setenv("MPT_CPUINFO", str(path))
  recorded = isa.parse_cpuinfo(path.read_text())
  cpu = isa.detect()
  assert cpu.source == str(path)
  assert (cpu.name, cpu.flags, cpu.logical_cpus) == (
      recorded.name, recorded.flags, recorded.logical_cpus)
  assert hardware.cpu_flags() == recorded.flags and hardware.cpu_name() == recorded.name
  peak, source = hardware.peak_gflops("float32")
  expected = isa.peak_gflops(recorded, "float32")
  assert (peak, source) == (expected["gflops"], f"estimate: {expected['assumptions']}")
  # The session hides GPUs (conftest.py), so the device is the stand-in CPU.
  assert hardware.device_name() == (
      f"CPU: {recorded.name} ({os.cpu_count()} logical cores)")


@pytest.mark.skipif(not pathlib.Path("/proc/cpuinfo").is_file(),
                    reason="no /proc/cpuinfo on this host (not Linux)")
def test_without_mpt_cpuinfo_the_host_is_read(monkeypatch):
  """The one test that reads this machine's own CPU facts."""
  monkeypatch.delenv("MPT_CPUINFO", raising=False)
  cpu = isa.detect()
  assert cpu.source == "/proc/cpuinfo"
  assert cpu.logical_cpus >= 1 and cpu.name


def test_an_unreadable_mpt_cpuinfo_falls_back_and_says_so(monkeypatch, tmp_path):
  monkeypatch.setenv("MPT_CPUINFO", str(tmp_path / "missing"))
  cpu = isa.detect()
  assert f"{tmp_path / 'missing'} not readable" in cpu.source
  assert cpu.flags == isa.numpy_features()
