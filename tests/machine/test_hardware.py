"""Where mpt's CPU facts come from, and the peak and device name built on them (the
per-cycle rule itself: test_microbench); the usable cores beside the host's in the
device name and summary.json (how they are counted: test_cores.py); GPU data-sheet
peaks by exact model; TF's default for its oneDNN rewrite on recorded CPUs. The
measured ceilings are in test_ceilings.py, xprof's kernel table in
test_gpu_kernels.py."""

import os
import pathlib

import pytest

from mpt.machine import cores
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


# --- Usable cores in the device name and the record (counted: test_cores.py) ---

@pytest.mark.parametrize("usable,host,said", [
    (8, 8, "8 logical cores"), (2, 8, "2 of 8 logical cores usable")])
def test_the_device_name_says_the_usable_cores_beside_the_hosts(monkeypatch, usable,
                                                                 host, said):
  """Under taskset, `docker --cpus`, a Kubernetes CPU limit or a SLURM cpuset a run
  has fewer cores than the host: the name says both counts."""
  monkeypatch.setenv("MPT_CPUINFO", str(CPUINFO / "intel_spr_amx_recorded.txt"))
  monkeypatch.setattr(cores, "usable_cores", lambda: usable)
  monkeypatch.setattr(hardware.os, "cpu_count", lambda: host)
  # The session hides GPUs (conftest.py), so the device is the stand-in CPU.
  assert hardware.device_name() == f"CPU: Intel(R) Xeon(R) Processor ({said})"


def test_the_hardware_record_keeps_each_count(monkeypatch):
  """summary.json's `hardware`: the usable count beside what it came from."""
  monkeypatch.setattr(cores, "affinity", lambda: [0, 1, 2, 3])
  monkeypatch.setattr(cores, "cpu_quota", lambda: 1.5)
  monkeypatch.setattr(hardware.os, "cpu_count", lambda: 64)
  found = hardware.facts()
  assert (found.cpu_count, found.affinity_cpus, found.cpu_quota,
          found.host_cpu_count) == (2, 4, 1.5, 64)


# --- GPU data sheets: the exact model, never a substring of another's name ---

@pytest.mark.parametrize("name,model", [
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A100-PCIE-40GB", "A100 PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe"), ("Tesla V100-SXM2-16GB", "V100"),
    ("Tesla V100-PCIE-32GB", "V100 PCIe"), ("Tesla T4", "T4"), ("NVIDIA L4", "L4"),
    ("NVIDIA L40", "L40"), ("NVIDIA L40S", "L40S"), ("NVIDIA A10G", "A10G"),
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA H200", "H200"), ("NVIDIA B200", "B200"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("NVIDIA TITAN Xp", "TITAN Xp"),
    ("Quadro M2200", "M2200"), ("NVIDIA A100X", "A100X"), ("NVIDIA", ""),
])
def test_device_names_reduce_to_their_model(name, model):
  assert hardware.gpu_model(name) == model


def test_every_data_sheet_entry_is_reachable_from_a_device_name():
  for key in hardware.GPU_PEAK_TFLOPS:
    assert hardware.gpu_model(f"NVIDIA {key}") == key


@pytest.mark.parametrize("name,dtype,tflops,key", [
    # L40S is not L4, nor L40 (a substring match took "L4" for all three).
    ("NVIDIA L40S", "bfloat16", 362.05, "L40S"),
    ("NVIDIA L40S", "float32", 183.0, "L40S"),
    ("NVIDIA L40", "bfloat16", 181.05, "L40"), ("NVIDIA L4", "bfloat16", 121.0, "L4"),
    ("NVIDIA H100 80GB HBM3", "float16", 989.5, "H100"),
    ("NVIDIA H100 PCIe", "float16", 756.5, "H100 PCIe"),
    ("NVIDIA H200", "bfloat16", 989.5, "H200"),
    ("NVIDIA B200", "bfloat16", 2250.0, "B200"),
    ("Tesla V100-SXM2-16GB", "float16", 125.0, "V100"),
    ("Tesla V100-PCIE-16GB", "float16", 112.0, "V100 PCIe"),
    ("NVIDIA A100-SXM4-40GB", "float32", 156.0, "A100"),  # TF32, TensorFlow's default
])
def test_data_sheet_peaks_by_exact_model(name, dtype, tflops, key):
  found, source = hardware.gpu_peak_tflops(name, dtype)
  assert found == tflops
  assert source.startswith(f"data sheet: {key} {dtype}")


def test_without_tf32_float32_is_the_fp32_units_rate():
  assert hardware.gpu_peak_tflops("NVIDIA A100-SXM4-40GB", "float32", tf32=False) == (
      19.5, "data sheet: A100 float32_fp32")
  # Pre-Ampere parts have one float32 rate either way.
  assert hardware.gpu_peak_tflops("Tesla T4", "float32", tf32=False)[0] == 8.1


@pytest.mark.parametrize("name,dtype,words", [
    ("NVIDIA GeForce RTX 4090", "float16", "model 'RTX 4090' is not in the table"),
    ("NVIDIA H200 NVL", "bfloat16", "model 'H200 NVL' is not in the table"),
    ("NVIDIA A100X", "float16", "model 'A100X' is not in the table"),
    ("Tesla V100-SXM2-16GB", "bfloat16", "no data-sheet figure for bfloat16"),
])
def test_unknown_models_and_unlisted_dtypes_have_no_peak_and_say_why(name, dtype, words):
  found, reason = hardware.gpu_peak_tflops(name, dtype)
  assert found is None
  assert reason.startswith("no data-sheet figure") and words in reason


def test_approximate_figures_say_so():
  assert "approximate" in hardware.gpu_peak_tflops("NVIDIA A10G", "float16")[1]


def test_peak_gflops_on_a_gpu_machine_uses_the_data_sheet_for_every_gpu(monkeypatch):
  import tensorflow as tf
  fake = [tf.config.PhysicalDevice(name=f"/physical_device:GPU:{i}", device_type="GPU")
          for i in range(2)]
  monkeypatch.setattr(tf.config, "list_physical_devices",
                      lambda kind=None: fake if kind == "GPU" else [])
  monkeypatch.setattr(tf.config.experimental, "get_device_details",
                      lambda device: {"device_name": "NVIDIA L40S"})
  assert hardware.peak_gflops("float16") == (2 * 362.05e3, "data sheet: L40S float16")


@pytest.mark.parametrize("cpuinfo,expect,word", [
    ("amd_epyc_zen3_dev_machine", False, "without AVX512_VNNI"),  # AVX2 + FMA only.
    ("intel_broadwell_avx2", False, "without AVX512_VNNI"),
    ("amd_epyc_zen4_dev_machine", True, "AVX512_VNNI"),
    ("intel_spr_amx_recorded", True, "AVX512_VNNI"),
    ("arm_neoverse_v1", None, "not x86"),
])
def test_tfs_default_for_its_onednn_rewrite_on_recorded_cpus(cpuinfo, expect, word):
  """TF 2.21's DefaultOneDnnPolicy (tensorflow/core/util/port.cc): on for x86 CPUs with
  AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX; tests/train/common/test_keras_fit.py holds the
  rule to TF's own answer on the host."""
  cpu = isa.detect(str(CPUINFO / f"{cpuinfo}.txt"))
  on, why = hardware.onednn_default(cpu.flags)
  assert on is expect and word in why
