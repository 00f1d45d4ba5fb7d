"""Peak FLOP figures: the per-cycle rule and this machine's estimate."""

import pytest

from mpt import hardware


@pytest.mark.parametrize("flags,dtype,expect", [
    ({"sse4_2"}, "float32", 8),
    ({"avx2", "fma"}, "float32", 32),
    ({"avx2", "fma"}, "bfloat16", 32),
    ({"avx512f", "avx2", "fma"}, "float32", 64),
    ({"avx512f", "avx512_bf16"}, "bfloat16", 128),
    ({"avx512f", "avx512_bf16"}, "float16", 64),
    ({"avx512f", "avx512_fp16"}, "float16", 128),
])
def test_flops_per_cycle(flags, dtype, expect):
  assert hardware.cpu_flops_per_cycle(flags, dtype) == expect


def test_this_machine_has_a_cpu_estimate():
  peak, source = hardware.peak_gflops("float32")
  assert peak > 0 and source.startswith("estimate:")
  assert hardware.device_name().startswith("CPU: ")
