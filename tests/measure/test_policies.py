"""A built model's layers under another policy and back (mpt/measure/policies.py), and
a per-layer plan as the DTypePolicyMap a script applies: read back from the model by
what its layers compute (their outputs' dtypes), not from mpt. The Keras 3.15
behaviour the module relies on is checked here first, so a Keras upgrade that
changes it fails loudly."""

import json

import keras
import numpy as np
import pytest

from mpt import speech
from mpt.measure import policies


@pytest.fixture(autouse=True)
def float32_after():
  yield
  keras.mixed_precision.set_global_policy("float32")


def _net(prefix: str = "") -> keras.Model:
  """Named layers (a script building the same model gets the same paths), one
  pinned to float32 as scripts pin their softmax."""
  inputs = keras.Input((6, 6, 3), name=f"{prefix}x")
  h = keras.layers.Conv2D(8, 3, name=f"{prefix}conv")(inputs)
  h = keras.layers.BatchNormalization(name=f"{prefix}bn")(h)
  h = keras.layers.GlobalAveragePooling2D(name=f"{prefix}gap")(h)
  h = keras.layers.Dense(4, name=f"{prefix}dense")(h)
  out = keras.layers.Activation("softmax", dtype="float32", name=f"{prefix}probs")(h)
  return keras.Model(inputs, out, name=f"{prefix}net")


def _computed(model: keras.Model) -> dict[str, str]:
  """Each named layer's output dtype on a real batch (a probe model over the layers'
  symbolic outputs: Keras computes them, mpt reads nothing)."""
  layers = [l for l in model.layers if not isinstance(l, keras.layers.InputLayer)]
  probe = keras.Model(model.inputs, [l.output for l in layers])
  outs = probe(np.ones((2, 6, 6, 3), "float32"))
  return {l.name: keras.backend.standardize_dtype(o.dtype) for l, o in zip(layers, outs)}


def test_keras_writes_a_layers_policy_into_the_map_it_holds():
  """What the module works around (Keras 3.15): a model built under a DTypePolicyMap
  as its global policy holds the map in every layer, each computing by its path, and
  setting one layer's policy writes into that shared map."""
  found = keras.dtype_policies.DTypePolicyMap(keras.DTypePolicy("mixed_bfloat16"))
  found["bn"] = keras.DTypePolicy("float32")
  keras.mixed_precision.set_global_policy(found)
  model = _net()
  conv, bn = model.get_layer("conv"), model.get_layer("bn")
  assert conv.dtype_policy is found and bn.dtype_policy is found
  assert (conv.compute_dtype, bn.compute_dtype) == ("bfloat16", "float32")
  conv.dtype_policy = "float16"
  assert found["conv"].name == "float16" and conv.dtype_policy is found


def test_switched_layers_compute_in_the_new_policy_and_get_their_objects_back():
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  model = _net()
  held = {l.name: l.dtype_policy for l in policies.layers_of(model)}
  with policies.switched(model, policies.uniform("float32", [("Dense", "float16")])):
    inside = _computed(model)
  assert inside == {"conv": "float32", "bn": "float32", "gap": "float32",
                    "dense": "float16", "probs": "float32"}
  assert all(l.dtype_policy is held[l.name] for l in policies.layers_of(model))
  assert _computed(model)["conv"] == "bfloat16"


def test_a_map_gets_its_entries_back_and_a_clones_pin_stands_out():
  """Under a map, a switch writes into it (Keras' setter) and the block's end puts
  the entries back; a clone's layers hold fresh objects of the model's policy name,
  and still follow it, while the float32 softmax keeps its own."""
  found = keras.dtype_policies.DTypePolicyMap(keras.DTypePolicy("mixed_bfloat16"))
  found["dense"] = keras.DTypePolicy("float32")
  keras.mixed_precision.set_global_policy(found)
  model = _net()
  with policies.switched(model, policies.uniform("float16")):
    assert _computed(model)["conv"] == "float16"
  assert [(k, v.name) for k, v in found.items()] == [("dense", "float32")]
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  clone = keras.models.clone_model(_net("c_"))
  own = policies.follows(clone)
  assert own[id(clone.get_layer("c_conv"))] and not own[id(clone.get_layer("c_probs"))]


def test_a_plan_written_by_mpt_is_applied_by_keras_alone(tmp_path):
  """The round trip: the plan's map written as policy_map.json; a script loads it
  with keras.saving, sets it as the global policy, builds the same model, and its
  layers compute in the dtypes the plan says."""
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  plan = policies.plan_map(_net(), "mixed_bfloat16", [("BatchNormalization", "float32"),
                                                      ("gap", "float32")])
  assert plan[1] == ["gap"]  # No weights, no path in Keras: it cannot be keyed.
  where = policies.write_map(tmp_path, plan, "a test plan")
  assert where.name == speech.MAP_FILE
  data = json.loads(where.read_text())
  assert data["keras_version"] == keras.__version__ and data["unkeyed"] == ["gap"]
  keras.mixed_precision.set_global_policy("float32")
  keras.mixed_precision.set_global_policy(
      keras.saving.deserialize_keras_object(data["policy_map"]))
  assert _computed(_net()) == {"conv": "bfloat16", "bn": "float32", "gap": "bfloat16",
                               "dense": "bfloat16", "probs": "float32"}
  assert "set_global_policy" in speech.apply_line(where)
  # The layer the map cannot hold, in the line a run prints too (docs/usage.md).
  assert f"{where}; " in speech.plan_line(where, plan[1])
  assert "not in it: gap (" in speech.plan_line(where, plan[1])


def test_under_float32_a_wrappers_copies_follow_and_a_pin_in_the_graph_does_not():
  """A Bidirectional makes its forward and backward LSTMs from its layer's config:
  float32 objects of their own, as the float32 output pin has. Built under float32
  (one policy object), a 16-bit switch reaches the copies (they follow their
  wrapper), not the pin (a layer of the model's graph)."""
  keras.mixed_precision.set_global_policy("float32")
  inputs = keras.Input((None,), dtype="int32")
  h = keras.layers.Embedding(30, 8)(inputs)
  h = keras.layers.Bidirectional(keras.layers.LSTM(8), name="bi")(h)
  model = keras.Model(inputs, keras.layers.Dense(1, dtype="float32", name="pin")(h))
  bi = model.get_layer("bi")
  assert bi.forward_layer.dtype_policy is not model.dtype_policy  # As described.
  with policies.switched(model, policies.uniform("mixed_bfloat16")):
    assert {bi.forward_layer.compute_dtype, bi.backward_layer.compute_dtype,
            bi.forward_layer.cell.compute_dtype} == {"bfloat16"}
    assert model.get_layer("pin").compute_dtype == "float32"
  assert bi.forward_layer.compute_dtype == "float32"
