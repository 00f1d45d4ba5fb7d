"""What mpt reads from a real NVIDIA GPU: run only on a host that has one (marker `gpu`;
skipped elsewhere). The rest of the suite hides GPUs (conftest.py), so these tests
start children that see the host's devices as the user's runs would, with none of the
session's stand-ins: the step's cost is measured (its kernel table profiled on the
GPU) and the host's own CPU and kernel facts are read."""

import json
import os
import subprocess

import pytest

from helpers import ROOT, tiny_cli

pytestmark = pytest.mark.gpu


def gpu_env() -> dict[str, str]:
  """The environment with the host's own CUDA_VISIBLE_DEVICES, as before the session,
  and without the stand-ins that would skip the GPU's features: MPT_COST=none (no
  cost, so no kernel table on the GPU), the recorded SPR cpuinfo and kernel table."""
  env = dict(os.environ)
  host = env.pop("MPT_TEST_HOST_CUDA_VISIBLE_DEVICES", "<unset>")
  env.pop("CUDA_VISIBLE_DEVICES", None)
  if host != "<unset>":
    env["CUDA_VISIBLE_DEVICES"] = host
  for stand_in in ("MPT_COST", "MPT_CPUINFO", "MPT_KERNELS"):
    env.pop(stand_in, None)
  return env


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_mixed_float16_run_on_the_gpu_records_the_gpu(tmp_path, loop):
  # 25 steps: past cost.MIN_RUN_STEPS (20), so the cost is measured and each policy's
  # step profiled; a 2-step warm-up leaves the default profile window (steps 3-4).
  proc = subprocess.run(
      tiny_cli(tmp_path, "--policy=mixed_float16", f"--loop={loop}", "--epochs=5",
               "--warmup_steps=2", "--run_name=g"),
      cwd=ROOT, capture_output=True, text=True, timeout=600, env=gpu_env())
  assert proc.returncode == 0, proc.stderr[-3000:]
  run = tmp_path / "logs" / "g"
  summary = json.loads((run / "summary.json").read_text())
  assert summary["status"] == "completed" and summary["device"].startswith("GPU: ")
  gpus = summary["hardware"]["gpus"]
  assert gpus and all(len(g["compute_capability"]) == 2 for g in gpus)
  assert summary["peak_source"].startswith(("data sheet: ", "no data-sheet figure"))
  # NVML's figures, or why they are missing; never "no GPU".
  absent = summary["gpu_util_absent"]
  assert absent is None or absent.startswith(("NVML unavailable", "nvidia-ml-py is not"))
  assert summary["loss_scale"] > 0
  # Profiled by default on a GPU (docs/usage.md: --profile_steps).
  assert list(run.glob("plugins/profile/*/*.xplane.pb")), proc.stdout[-3000:]
  # The kernel table on this GPU: measured before step 1, said in one line, kept.
  table = summary["cost"]["gpu_kernels"]
  assert table and table["rows"], summary["cost"].get("gpu_kernels_note")
  assert {r["dtype"] for r in table["rows"]} >= {"float32", "float16"}
  kernels_line = [l for l in proc.stdout.splitlines() if l.startswith("mpt: kernels on ")]
  assert len(kernels_line) == 1 and "Tensor Cores: " in kernels_line[0], proc.stdout
  # The CUDA-core warning: said exactly when the verdict found the share past 10%.
  verdict = summary["policy_verdict"]
  assert verdict["cuda_cores_share"] is not None  # Read from this GPU's table.
  warned = [l for l in proc.stdout.splitlines()
            if l.startswith("WARNING: ") and "not Tensor Cores" in l]
  assert len(warned) == (1 if verdict["cuda_cores_share"] >= 0.10 else 0), proc.stdout
  diagnosis = json.loads((run / "diagnosis.json").read_text())
  assert diagnosis["gpu"], diagnosis.get("notes")
