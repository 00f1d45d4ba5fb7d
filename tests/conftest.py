"""Shared fixtures: tiny configs on generated data, and reading TensorBoard events back."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pathlib
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from mpt import config

# The CPU is split into two logical devices for the whole session, before any op runs
# (the only time it can be): the mirrored-strategy tests run in process with
# cpu_devices=CPU_DEVICES. Ops of every other test still run on the first device.
CPU_DEVICES = 2
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration() for _ in range(CPU_DEVICES)])


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> pathlib.Path:
  """One synthetic-data cache for the whole session (generated on first use)."""
  return tmp_path_factory.mktemp("data")


@pytest.fixture
def tiny(tmp_path, data_dir):
  """Returns a factory of Configs that train for seconds: 32 px, 64 images, batch 8."""
  def make(**overrides) -> config.Config:
    values = dict(image_size=32, batch_size=8, epochs=3, synthetic_train=64,
                  synthetic_val=32, synthetic_px=40, warmup_steps=2, verbose=0,
                  learning_rate=3e-3, logdir=str(tmp_path / "logs"),
                  data_dir=str(data_dir))
    values.update(overrides)
    return config.Config(**values)
  return make


def read_events(run_dir) -> dict[str, list[tuple[int, object]]]:
  """{tag: [(step, value), ...]} of every summary in run_dir's event files.

  Scalars come back as floats, text summaries as str.
  """
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(
      str(run_dir), size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  decode = lambda v: v.decode() if isinstance(v, bytes) else float(v)
  events = {}
  for tag in acc.Tags()["tensors"]:
    values = [(e.step, tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
    if all(v.size == 1 for _, v in values):  # Not HParams' empty marker tensors.
      events[tag] = [(step, decode(v.item())) for step, v in values]
  return events


def read_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
  return {tag: values for tag, values in read_events(run_dir).items()
          if values and isinstance(values[0][1], float)}


ROOT = pathlib.Path(__file__).resolve().parents[1]


def tiny_cli(tmp_path, *flags: str) -> list[str]:
  """argv of `python -m mpt.main` training in seconds on tiny data under tmp_path."""
  return [sys.executable, "-m", "mpt.main", "--image_size=16", "--batch_size=4",
          "--synthetic_train=20", "--synthetic_val=10", "--synthetic_px=20",
          "--verbose=0", f"--data_dir={tmp_path}", f"--logdir={tmp_path}/logs", *flags]


def start_and_wait_for_an_epoch(tmp_path, *flags: str) -> subprocess.Popen:
  """Starts a long tiny run named `r`; returns once its first epoch is in the events."""
  proc = subprocess.Popen(
      tiny_cli(tmp_path, "--epochs=1000", "--steps_per_epoch=2", "--run_name=r", *flags),
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  run, deadline = tmp_path / "logs" / "r", time.time() + 120
  while time.time() < deadline and "train/loss" not in (
      read_events(run) if run.exists() else {}):
    time.sleep(0.2)
  return proc
