"""What mpt reads from a real NVIDIA GPU: run only on a host that has one (marker `gpu`;
skipped elsewhere). The rest of the suite hides GPUs (conftest.py), so these tests
start children that see the host's devices as the user's runs would."""

import json
import os
import subprocess

import pytest

from helpers import ROOT, tiny_cli

pytestmark = pytest.mark.gpu


def gpu_env() -> dict[str, str]:
  """The environment with the host's own CUDA_VISIBLE_DEVICES, as before the session."""
  env = dict(os.environ)
  host = env.pop("MPT_TEST_HOST_CUDA_VISIBLE_DEVICES", "<unset>")
  env.pop("CUDA_VISIBLE_DEVICES", None)
  if host != "<unset>":
    env["CUDA_VISIBLE_DEVICES"] = host
  return env


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_mixed_float16_run_on_the_gpu_records_the_gpu(tmp_path, loop):
  proc = subprocess.run(
      tiny_cli(tmp_path, "--policy=mixed_float16", f"--loop={loop}", "--epochs=1",
               "--run_name=g"),
      cwd=ROOT, capture_output=True, text=True, timeout=600, env=gpu_env())
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads((tmp_path / "logs" / "g" / "summary.json").read_text())
  assert summary["status"] == "completed" and summary["device"].startswith("GPU: ")
  gpus = summary["hardware"]["gpus"]
  assert gpus and all(len(g["compute_capability"]) == 2 for g in gpus)
  assert summary["peak_source"].startswith(("data sheet: ", "no data-sheet figure"))
  # NVML's figures, or why they are missing; never "no GPU".
  absent = summary["gpu_util_absent"]
  assert absent is None or absent.startswith(("NVML unavailable", "nvidia-ml-py is not"))
  assert summary["loss_scale"] > 0
