"""Per-layer dtype inspection of the seed convnet under the three policies."""

import json

import pytest

from mpt.measure import dtypes as inspect
from mpt import models
from mpt.train.common import precision

from mpt.records import numerics as numerics_lib
from helpers import mpt_forked, read_events

SIXTEEN = {"float32": "float32", "mixed_float16": "float16",
           "mixed_bfloat16": "bfloat16"}


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_observed_dtypes_of_the_seed_convnet(policy):
  precision.set_policy(policy)
  model = models.build("seed_convnet", (32, 32, 3), 10)
  report = inspect.inspect_model(model)
  rows = {r["name"]: r for r in report["layers"]}
  half = SIXTEEN[policy]
  # Observed in a forward pass: 16-bit everywhere but the float32 softmax output.
  for name in ("conv1", "bn1", "conv2", "bn2", "conv3", "bn3", "gap", "logits"):
    assert rows[name]["output_dtype"] == half, name
    assert rows[name]["variable_dtype"] == "float32"
  assert rows["probs"]["output_dtype"] == "float32"
  assert report["gradient_dtypes"] == ["float32"] and report["gradients_match_variables"]

  # conv1 sees 3 input channels: the one misaligned matrix layer.
  assert rows["conv1"]["dims"] == "3->32" and rows["conv1"]["aligned8"] is False
  assert rows["conv2"]["aligned8"] and rows["logits"]["aligned8"] is False  # 128->10
  assert report["misaligned_layers"] == ["conv1", "logits"]
  # conv1 at 32 px: 16x16x32 outputs x 5x5x3 multiply-adds x 2, plus the fused ReLU.
  assert rows["conv1"]["flops"] == 2 * 16 * 16 * 32 * 75 + 16 * 16 * 32

  reasons = {l["name"]: l["reason"] for l in report["float32_layers"]}
  if policy == "float32":
    assert set(reasons.values()) == {"float32 policy"} and report["flops_share_16bit"] == 0
  else:
    assert set(reasons) == {"bn1", "bn2", "bn3", "probs"}
    assert "BatchNormalization normalises in float32" in reasons["bn1"]
    assert "forced to float32" in reasons["probs"]
    assert 0.95 < report["flops_share_16bit"] < 1.0
  assert report["flops_share_16bit"] + report["flops_share_32bit"] == pytest.approx(1)
  table = inspect.format_table(report)
  assert "conv1" in table and "NO" in table and "gradient dtypes ['float32']" in table
  assert inspect.format_table(report, markdown=True).startswith("| name | class |")


def test_mode_inspect_runs_without_training(tmp_path):
  """Its report, its numerics on two batches of the data the run would train on (made
  here once, as a run would), and nothing a training run leaves (docs/outputs.md):
  no summary.json, flags.txt, checkpoints or diagnosis, no runs.csv line, and its
  events file holds only the texts, no step's scalar."""
  proc = mpt_forked("--mode=inspect", "--policy=mixed_bfloat16", "--image_size=48",
                    f"--logdir={tmp_path}/logs", "--run_name=i",
                    f"--data_dir={tmp_path}/data",  # Where training would make data,
                    "--synthetic_train=64", "--synthetic_val=32", "--synthetic_px=64")
  assert proc.returncode == 0, proc.stderr
  assert "compute dtype: bfloat16" in proc.stdout and "conv3" in proc.stdout
  run = tmp_path / "logs" / "i"
  report = json.loads((run / "dtypes.json").read_text())
  assert report["input_shape"] == [48, 48, 3] and report["policy"] == "mixed_bfloat16"
  assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["i"]  # No runs.csv.
  [events] = run.glob("events.out.tfevents.*")
  assert {p.name for p in run.iterdir()} == {"dtypes.json", "memory.json",
                                              "numerics.json", events.name}
  assert set(read_events(run)) == {"inspect/dtypes", "numerics/layers"}
  numerics = numerics_lib.read(run)
  assert [(s.step, s.examples) for s in numerics.samples] == [(0, 64)]
  assert "| conv3 | Conv2D | bfloat16 |" in proc.stdout  # Its table, printed.
  # The step a run would take, counted from its graph (traced, not run).
  assert report["step_flops"]["total"] > report["step_flops"]["matmul"] > 0
  assert f"the step at batch {report['step_flops']['batch_size']}: " in proc.stdout


def test_a_subclassed_twin_reads_like_the_functional_model():
  """The seed convnet's layers called from a subclassed model's `call` (no `inputs`,
  no `layer.output`): one observed call must give the Functional model's report, row
  for row (the Functional model is the oracle). Fails loudly if Keras stops routing
  layer calls through `keras.layers.Layer.__call__` (mpt/measure/observe.py)."""
  import keras
  from mpt.measure import observe
  precision.set_policy("mixed_bfloat16")
  functional = models.build("seed_convnet", (32, 32, 3), 10)
  layers = [l for l in functional.layers if not isinstance(l, keras.layers.InputLayer)]

  class Twin(keras.Model):
    def __init__(self):
      super().__init__(name="twin")
      self.stack = layers

    def call(self, x, training=False):
      for layer in self.stack:
        x = layer(x, training=training) if "bn" in layer.name else layer(x)
      return x

  twin = Twin()
  assert not hasattr(twin, "inputs") or not twin.inputs
  assert observe.input_shape(twin) is None  # Unbuilt: nothing tells its shape ...
  with pytest.raises(Exception, match="input shape is unknown"):
    inspect.inspect_model(twin)
  twin(keras.ops.zeros((1, 32, 32, 3)))
  assert observe.input_shape(twin)[1:] == (32, 32, 3)  # ... until it is built.
  mine, theirs = inspect.inspect_model(twin), inspect.inspect_model(functional)
  # The oracle: the Functional graph's own nodes, read without observing any call.
  probe = keras.Model(functional.inputs, [l.output for l in layers])
  outputs = probe(keras.ops.zeros((2, 32, 32, 3)))
  oracle = [(l.name, keras.backend.standardize_dtype(o.dtype),
             inspect.layer_flops(l, tuple(l.input.shape), tuple(l.output.shape))[0])
            for l, o in zip(layers, outputs)]
  for report in (mine, theirs):
    assert [(r["name"], r["output_dtype"], r["flops"]) for r in report["layers"]] == \
        oracle
  for key in ("forward_flops_per_example", "flops_share_16bit", "params",
              "gradient_dtypes", "misaligned_layers", "float32_layers"):
    assert mine[key] == theirs[key], key


def test_models_as_researchers_write_them():
  """Several inputs (a dict with string and integer features, a nested list), and a
  model with no call() that holds its parts: each is inspected on inputs made from
  what it declares, its input shapes recorded as they are."""
  import keras
  text = keras.Input((), dtype="string", name="review")
  ids = keras.Input((None,), dtype="int32", name="ids")
  price = keras.Input((3,), name="price")
  vectorize = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=5)
  vectorize.adapt(["a b c", "d e"])
  h = keras.layers.Concatenate()([
      keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(30, 4)(vectorize(text))),
      keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(30, 4)(ids)), price])
  tabular = keras.Model({"review": text, "ids": ids, "price": price},
                        keras.layers.Dense(1)(h), name="tabular")
  report = inspect.inspect_model(tabular)
  assert report["inputs"] == {"ids": [8], "price": [3], "review": []}
  assert {"TextVectorization", "Embedding", "Dense"} <= {r["class"] for r in report["layers"]}

  a, b = keras.Input((2,)), keras.Input((3,))
  nested = keras.Model([a, [b]], keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))
  assert inspect.inspect_model(nested)["inputs"] == {"0": [2], "1/0": [3]}

  class Gan(keras.Model):  # No call(): a generator and a discriminator.
    def __init__(self):
      super().__init__(name="gan")
      self.generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6)],
                                        name="g")
      self.discriminator = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)],
                                            name="d")

  gan = inspect.inspect_model(Gan())
  assert gan["parts"] == ["g", "d"] and gan["params"] == 4 * 6 + 6 + 6 + 1
  assert [(r["name"].split("/")[0], r["class"]) for r in gan["layers"]] == \
      [("g", "Dense"), ("d", "Dense")]
  assert gan["inputs"] == {"g/input": [4], "d/input": [6]}


def test_nested_layers_are_named_by_their_path_and_no_two_rows_share_a_name():
  """Two attention layers hold sublayers of the same names (query, key, value,
  attention_output): each row is named by its path, `owner/sublayer`."""
  import keras
  from mpt.measure import dtypes as dtypes_lib
  x = keras.Input((6, 8))
  a = keras.layers.MultiHeadAttention(2, 4, name="self_attention")(x, x)
  y = keras.layers.MultiHeadAttention(2, 4, name="cross_attention")(a, x)
  names = [r["name"] for r in dtypes_lib.inspect_model(keras.Model(x, y))["layers"]]
  assert len(names) == len(set(names)), names
  for owner in ("self_attention", "cross_attention"):
    assert {f"{owner}/{n}" for n in ("query", "key", "value", "attention_output")} <= \
        set(names), names


def test_an_ema_copy_is_a_part_named_apart_from_its_original():
  """A diffusion model's shape: no call() of its own, its network and an EMA copy made
  by clone_model (the same model name): the parts by the attributes that hold them."""
  import keras
  from mpt.measure import dtypes as dtypes_lib

  class Diffusion(keras.Model):
    def __init__(self):
      super().__init__(name="diffusion")
      self.network = keras.Sequential(
          [keras.Input((8,)), keras.layers.Dense(4)], name="unet")
      self.ema_network = keras.models.clone_model(self.network)

  model = Diffusion()
  assert model.ema_network.name == model.network.name  # What made the names clash.
  report = dtypes_lib.inspect_model(model)
  assert report["parts"] == ["network", "ema_network"]
  names = [r["name"] for r in report["layers"]]
  assert len(names) == len(set(names)) == 2 and names[0].startswith("network/")


def test_einsum_dense_counts_the_products_of_its_equation():
  """The forward table: an EinsumDense by the axes its equation sums over, by hand
  (not one FLOP per output element): 6 tokens of 8 -> 2 heads x 4, per example."""
  import keras
  model = keras.Sequential([keras.Input((6, 8)),
                            keras.layers.EinsumDense("btd,dnh->btnh", (6, 2, 4))])
  row = inspect.inspect_model(model)["layers"][0]
  assert row["flops"] == 2 * 6 * (2 * 4) * 8


def test_the_line_reads_each_layers_dtype_not_the_global_policy():
  """A float32 run whose convolutions compute in float16 (--layer_policy) is not
  "all in float32" (the line once read the global policy)."""
  precision.set_policy("float32")
  model = models.build("seed_convnet", (32, 32, 3), 10)
  assert "all in float32" in inspect.one_line(inspect.inspect_model(model))
  for layer in model.layers:
    if layer.name.startswith("conv"):
      layer.dtype_policy = "mixed_float16"
  line = inspect.one_line(inspect.inspect_model(model))
  assert "all in float32" not in line and "of them in 16-bit" in line


def test_the_forward_flops_leave_out_the_parts_the_step_never_runs():
  """The step counted: a part it never runs (a diffusion model's EMA copy) is not in
  the forward FLOPs either (the two figures once disagreed by the copy)."""
  rows = [{"name": n, "flops": f, "float32_reason": None, "aligned8": True}
          for n, f in (("net/conv", 100), ("net/dense", 20), ("ema/conv", 100))]
  report = {"layers": rows, "policy": "mixed_float16", "misaligned_layers": [],
            "float32_layers": [], "forward_flops_per_example": 220}
  inspect.with_step(report, {"total": 720}, {"net/conv": 600, "net/dense": 120},
                    {"float16": 720}, {})
  assert report["forward_flops_per_example"] == 120
  assert [r["step_flops"] for r in rows] == [600, 120, None]
