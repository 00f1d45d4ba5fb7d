"""This machine's peak estimate and device name (the per-cycle rule: test_microbench)."""

from mpt import hardware


def test_this_machine_has_a_cpu_estimate():
  peak, source = hardware.peak_gflops("float32")
  assert peak > 0 and source.startswith("estimate:")
  assert hardware.device_name().startswith("CPU: ")
