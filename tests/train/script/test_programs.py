"""mpt under Keras training programs of many shapes (tests/train/script/programs/, each in the
shape of a keras.io guide or example: fit with a custom train_step, a GAN with two
optimizers, a VAE with add_loss, string and dict inputs, a multi-input model, a
MirroredStrategy, loops of its own under `mpt.track`, mixed_float16 with skipped
steps, ...). run_all.py runs them all once, in one child process; each program's run
folder is then read back and compared with the figures the program fixed itself:
status, steps, epochs, policy, loop, skipped steps and loss scale (summary.json), and
its diagnosis.
"""

import importlib.util
import json

import pytest

from helpers import ROOT, script_forked
from mpt import speech
from mpt.records import numerics as numerics_lib
from mpt.records import summary as summary_lib

pytestmark = pytest.mark.slow

RUNNER = ROOT / "tests" / "train" / "script" / "programs" / "run_all.py"
# summary.json fields a program's expectation may name (only those it names are read).
FIELDS = ("status", "steps", "epochs_completed", "policy", "loop", "skipped_steps",
          "loss_scale")


def _run_all():
  spec = importlib.util.spec_from_file_location("mpt_programs_run_all", RUNNER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)  # Imports nothing of TensorFlow or Keras.
  return module


NEEDS = _run_all().NEEDS
# The programs whose extra's module is installed (find_spec imports nothing).
PROGRAMS = tuple(name for name in _run_all().PROGRAMS
                 if importlib.util.find_spec(NEEDS.get(name, "mpt")) is not None)


def _mismatches(out, name: str, result: dict) -> list[str]:
  """What program `name`'s run folder got wrong against what the program fixed."""
  if result["error"] is not None:
    return [f"{name} raised:\n{result['error']}"]
  expected = result["expected"]
  assert set(expected) <= set(FIELDS) and {"status", "steps", "policy"} <= set(expected)
  run_dir = out / name
  summary = summary_lib.read(run_dir / "summary.json")
  found = {field: getattr(summary, field) for field in FIELDS if field in expected}
  wrong = [f"{name}: {found} != {expected}"] if found != expected else []
  if not (run_dir / "diagnosis.md").exists():
    wrong.append(f"{name}: no diagnosis.md")
  return wrong


def test_every_program_gets_its_run_folder(tmp_path):
  """Every program run once in one child (one test, not one per program: under
  pytest-xdist a shared fixture would run the whole corpus once per worker), each
  run folder compared with the figures the program fixed: loss_scale exactly."""
  out = tmp_path / "out"
  # Its start is not under test.
  proc = script_forked(RUNNER, str(out), *PROGRAMS, cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((out / "results.json").read_text())
  assert list(results) == list(PROGRAMS)
  wrong = [line for name in PROGRAMS for line in _mismatches(out, name, results[name])]
  assert not wrong, "\n".join(wrong)
  _honest_figures(out)


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_a_program_of_an_extra_runs_where_the_extra_is_installed(name):
  """Said, not silent, where an extra is missing (the corpus test leaves it out).
  Where the extra is installed this body does nothing by design and cannot fail: the
  program then runs in the corpus test above, which checks it."""
  if name not in PROGRAMS:
    pytest.skip(f"{name} needs {NEEDS[name]} (setup.cfg's extra `hub`), not installed: "
                "left out of the corpus")


def _honest_figures(out) -> None:
  """The figures that misled before (issue 40), on the programs that showed them."""
  read = lambda name: summary_lib.read(out / name / "summary.json")
  for name in PROGRAMS:  # A script's record is not a flagfile; its advice its API's.
    assert not (out / name / "flags.txt").exists(), name
    # No two rows share a name (nested layers by their path, parts apart).
    rows = [r["name"] for r in json.loads((out / name / "dtypes.json").read_text())["layers"]]
    assert len(rows) == len(set(rows)), (name, rows)
    if (out / name / "numerics.json").exists():
      for sample in numerics_lib.read(out / name).samples:
        sampled = [l.name for l in sample.layers]
        assert len(sampled) == len(set(sampled)), (name, sampled)
    text = (out / name / "diagnosis.md").read_text()
    assert speech.flags_left(text) == [], (name, speech.flags_left(text))
    program = read(name).program
    assert sum(f.epochs_completed for f in program.fits) == read(name).epochs_completed
  # The step is not timed per policy where mpt cannot time it alone (MPT_COST=none
  # stands in for the rest): a model built under a strategy. A GAN's own train_step is
  # the program's step: timed like any (here stood in for).
  assert read("mirrored_fit").not_measured["cost"].startswith(
      "the model was built under MirroredStrategy")
  assert read("gan_fit").not_measured["cost"] == "MPT_COST=none: not measured"
  # A model mpt cannot call (a GAN holding two), here under mixed_bfloat16 (numerics
  # sampled): no numerics, said, not guessed.
  assert "numerics" in read("gan_loop").not_measured, read("gan_loop").not_measured
  # Images are images; vectors, text and several inputs are not ("784 px" before).
  image = read("image_classifier")
  assert (image.image_size, image.images_per_sec > 0) == (16, True)
  for name in ("loop_from_scratch", "text_classifier", "structured_data", "siamese"):
    s = read(name)
    assert (s.image_size, s.images_per_sec) == (None, None) and s.examples_per_sec > 0
    first = (out / name / "diagnosis.md").read_text().split(" px,")
    assert len(first) == 1, name
  assert read("loop_from_scratch").program.inputs == {"input": [20]}
  assert set(read("structured_data").program.inputs) == {"age", "income", "city", "plan"}
  # Accuracy under any metric name (binary_accuracy was recorded as null).
  text = read("text_classifier")
  assert text.train_accuracy == text.metrics["binary_accuracy"] is not None
  assert text.val_accuracy == text.metrics.get("val_binary_accuracy")
  # Several optimizers: the two a GAN steps, not the default compile() made.
  gan = read("gan_fit").program
  assert len(gan.optimizers) == 3 and len(gan.stepped()) == 2
  assert [o.updates for o in gan.optimizers if o not in gan.stepped()] == [0]
  # Parts as they are: the EMA copy (clone_model: its original's name) apart, read
  # only; the trained parameters its network's alone (Keras' own count per layer).
  ema = json.loads((out / "diffusion_ema" / "dtypes.json").read_text())
  assert ema["parts"] == ["network", "ema_network"]
  assert ema["read_only_parts"] == ["ema_network"]
  assert ema["trained_params"] == sum(r["params"] for r in ema["layers"]
                                      if r["name"].startswith("network/")) > 0
  # Its step's FLOPs per layer: the network's first convolution (8x8x8 outputs of a
  # 3x3x3 window, batch 8) forward and its weights' gradient, by hand; the copy's
  # rows none (the step never calls it).
  rows = {r["name"]: r["step_flops"] for r in ema["layers"]}
  assert rows["network/conv2d"] == pytest.approx(2 * 2 * 8 * 8 * 8 * 27 * 8, rel=0.1)
  assert all(n is None for name, n in rows.items() if name.startswith("ema_network/"))
  # A loop that trains an image through a frozen extractor: no weight trained, its
  # step's FLOPs (3 images forward, input gradients only) from the step's graph.
  frozen = read("input_optimisation")
  assert json.loads((out / "input_optimisation" / "dtypes.json").read_text())[
      "trained_params"] == 0
  assert frozen.flops_counted_by.startswith("graph:") and frozen.flops_per_step > 0
  assert "never called run.end_epoch()" in frozen.not_measured["epochs"]
  # Nested layers keep their owner: the Transformer's projections by their path.
  names = {r["name"] for r in json.loads(
      (out / "seq2seq_transformer" / "dtypes.json").read_text())["layers"]}
  assert "transformer_encoder/multi_head_attention/query" in names, names
  # Its numerics sampled in float32 whole: the layers its blocks hold in a list (the
  # decoder's norms) switched too (float16 beside float32 failed the sample before).
  assert "numerics" not in read("seq2seq_transformer").not_measured
  if "keras_hub_backbone" in PROGRAMS:
    _keras_hub_figures(out)
  # What the program ran, per fit: a fine-tune's two fits, their optimizers' rates.
  tune = read("fine_tune").program
  assert [(f.epochs, f.epochs_completed) for f in tune.fits] == [(2, 2), (1, 1)]
  assert [o.inner for o in tune.optimizers] == ["Adam", "Adam"]


def _keras_hub_figures(out) -> None:
  """A KerasHub Gemma under mixed_bfloat16: each layer's FLOPs in the step, by hand;
  the logits projection the backbone computes in float32 named as float32 work."""
  d = json.loads((out / "keras_hub_backbone" / "dtypes.json").read_text())
  rows = {r["name"]: r for r in d["layers"]}
  # The query projection, batch 4 x 16 tokens, 32 -> 2 heads x 16: forward, the
  # kernel's gradient and the input's gradient, 2 FLOPs per multiply-add each.
  hand = 3 * 2 * (4 * 16) * 32 * (2 * 16)
  assert abs(rows["decoder_block_0/attention/query"]["step_flops"] - hand) <= 0.1 * hand
  assert d["shares_of"] == "the step's FLOPs" and d["step_flops"]["total"] > 0
  float32 = {l["name"]: l for l in d["float32_layers"]}
  assert float32["token_embedding"]["reason"].startswith("its ops compute in float32")
  assert float32["token_embedding"]["flops_share"] > 0.05, float32
