"""Resume indistinguishable from never stopping: one run killed (SIGKILL, from inside,
at a moment `MPT_KILL_AT` names) and resumed again and again, against the same run
uninterrupted: weights, optimizer state, every summary.json figure but timings, and
the TensorBoard series (same steps, same values, none twice, none missing).

The runs are tiny: 3 epochs of 5 steps, a checkpoint every 2 steps, so the kills
land mid-epoch past a checkpoint, inside a checkpoint's save, inside an evaluation,
and right after an epoch boundary. Each process is forked from a server that has
imported TensorFlow (tests/helpers.mpt_forked): a process of its own, killed for
real, without paying the import at each of the 12 starts.
"""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from helpers import TINY_FLAGS, mpt_forked, read_scalars

FLAGS = TINY_FLAGS + ["--deterministic", "--epochs=3", "--checkpoint_every=2",
                      "--log_every=1", "--sample_every=0.05", "--warmup_steps=1"]
# 20 images in batches of 4: 5 steps an epoch, 15 in all; checkpoints at 2, 4, 5 (the
# epoch's end, after its evaluation), 6, 8, 10, 12, 14, 15.
KILLS = [
    ("end:3", 2),    # mid-epoch, past checkpoint 2: resumes inside the epoch
    ("save:4", 2),   # checkpoint 4's files written, the index not yet naming them
    ("begin:6", 5),  # right after the epoch boundary and its checkpoint
    ("eval:10", 8),  # in epoch 2's evaluation: checkpoint 10 waits for the epoch's end
]
# Measured by the clock, or naming where and when: they differ between two identical
# runs, or between a run and its resumed twin by design.
NOT_COMPARED = {
    "run_dir", "resumed", "checkpoint", "wall_s", "train_s", "ms_per_step",
    "step_time_ms", "images_per_sec", "examples_per_sec", "timed_steps", "data_wait_share",
    "achieved_gflops", "mfu", "achieved_vs_microbench", "util", "checkpoint_ms",
    "memory", "skip_causes"}


def weights_and_slots(run_dir: pathlib.Path) -> dict[str, np.ndarray]:
  """The final checkpoint's model and optimizer variables (loss scale included)."""
  reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
          if name.startswith(("model/", "optimizer/"))}


def series(run_dir: pathlib.Path) -> dict[str, list]:
  """Each scalar series but the clock-driven ones: (step, value) for the figures a
  run computes, steps only for its timings."""
  out = {}
  for tag, values in read_scalars(run_dir).items():
    if tag.startswith(("train/", "eval/", "precision/", "final/val_")):
      out[tag] = values
    elif tag.startswith("perf/"):
      out[tag] = [step for step, _ in values]
  return out


def assert_like_never_stopped(tmp_path, name: str, flags: list[str],
                              kills: list[tuple[str, int]]) -> None:
  common = [*flags, f"--data_dir={tmp_path}", f"--logdir={tmp_path}/logs"]
  full = mpt_forked(*common, "--run_name=full")
  assert full.returncode == 0, full.stderr[-3000:]
  run = tmp_path / "logs" / name
  proc = mpt_forked(*common, f"--run_name={name}", env={"MPT_KILL_AT": kills[0][0]})
  for i, (at, restored) in enumerate(kills):
    assert proc.returncode == -9, (at, proc.returncode, proc.stderr[-3000:])
    nxt = {"MPT_KILL_AT": kills[i + 1][0]} if i + 1 < len(kills) else {}
    proc = mpt_forked(f"--resume={run}", "--verbose=0", env=nxt)
    assert f"mpt: resuming {run} at step {restored}" in proc.stdout, (at, proc.stdout)
  assert proc.returncode == 0, proc.stderr[-3000:]

  a, b = weights_and_slots(tmp_path / "logs" / "full"), weights_and_slots(run)
  assert a.keys() == b.keys() and len(a) > 10
  assert [k for k in a if not np.array_equal(a[k], b[k])] == []  # Bitwise.
  expected = json.loads((tmp_path / "logs" / "full" / "summary.json").read_text())
  got = json.loads((run / "summary.json").read_text())
  assert got["resumed"] and got["status"] == "completed"
  for key in expected.keys() - NOT_COMPARED:
    assert got[key] == expected[key], key
  # The skipped steps replayed, before the kill and after: the same, but for the time
  # each replay took.
  untimed = lambda causes: [{k: v for k, v in c.items() if k != "seconds"} for c in causes]
  assert untimed(got["skip_causes"]) == untimed(expected["skip_causes"])
  assert got["util"].keys() == expected["util"].keys()
  # Timings cover the whole run: every step that survived in the checkpoints, less
  # each attempt's first (its trace, --warmup_steps=1) where that step survived. An
  # attempt killed before its next checkpoint lost its steps, its first included.
  restored = [r for _, r in kills]
  firsts = 1 + sum(1 for i, r in enumerate(restored)
                   if i + 1 == len(restored) or restored[i + 1] > r)
  steps = 5 * expected["epochs"]
  assert expected["timed_steps"] == steps - 1
  assert got["timed_steps"] == steps - firsts, (got["timed_steps"], firsts)
  assert got["ms_per_step"] == got["step_time_ms"]["median"] > 0
  assert got["wall_s"] > got["train_s"] > 0
  want = series(tmp_path / "logs" / "full")
  assert [s for s, _ in want["train/loss"]] == list(range(5, steps + 1, 5))
  assert want["perf/step_time_ms"] == list(range(1, steps + 1))
  assert series(run)["train/loss"] == want["train/loss"]  # The first symptom.
  assert series(run) == want


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_killed_anywhere_and_resumed_reports_what_a_run_never_stopped_reports(
    tmp_path, loop):
  assert_like_never_stopped(tmp_path, "killed", FLAGS + [f"--loop={loop}"], KILLS)


@pytest.mark.slow
def test_mixed_float16_resumes_with_the_same_loss_scale_and_skipped_steps(tmp_path):
  """The first steps under a loss scale of 2^15 overflow float16 and are skipped (the
  scale halves each time): a kill among them must resume the same scale and count."""
  flags = FLAGS + ["--loop=custom", "--policy=mixed_float16", "--epochs=1",
                   "--fault_steps=2,3", "--fault_factor=1e30"]
  assert_like_never_stopped(tmp_path, "killed", flags, [("end:3", 2)])
  summary = json.loads((tmp_path / "logs" / "killed" / "summary.json").read_text())
  assert summary["skipped_steps"] >= 2 and summary["loss_scale"] < 2.0**15
  # --deterministic's loss holds a NaN constant by design (for invalid labels): no
  # replay names it, or an op that only passed it on, as a skip's cause.
  causes = summary["skip_causes"]
  assert causes and not any((c["layer"] or "").startswith("loss/") for c in causes), causes
