"""The profiler trace's op statistics (mpt/diagnose/opstats.py): op types named alike
whatever CPU TensorFlow ran on, and the kernels of one op grouped under it. On a real
trace a run wrote: tests/measure/test_profiler.py."""

import pytest

from mpt.diagnose import opstats

# Op types as traces name them, by the CPU TensorFlow ran on, and what they stand for.
# Sapphire Rapids (TF's oneDNN rewrite on: AVX512_BF16/AMX): issue 14's trace; the
# seed convnet's trace on AMD Zen 3 (rewrite off) in tests/data/runs/bf16_seed.
RECORDED_TYPES = {
    "_MklNativeConv2D": "Conv2D", "_MklNativeFusedConv2D": "Conv2D",
    "_MklNativeConv2DBackpropFilterWithBias": "Conv2DBackpropFilter",
    "_MklNativeConv2DBackpropInput": "Conv2DBackpropInput",
    "_MklNativeFusedBatchNormV3": "FusedBatchNormV3",
    "_MklNativeFusedMatMul": "MatMul", "_MklNativeMatMul": "MatMul",
    "_MklNativeDepthwiseConv2dNative": "DepthwiseConv2dNative",
    "Conv2D": "Conv2D", "_FusedConv2D": "Conv2D",
    "Conv2DBackpropFilter": "Conv2DBackpropFilter",
    "Conv2DBackpropInput": "Conv2DBackpropInput", "_FusedMatMul": "MatMul",
    "FusedBatchNormGradV3": "FusedBatchNormGradV3", "Cast": "Cast", "_MklCast": "Cast",
    "_Arg": "_Arg", "BiasAddGrad": "BiasAddGrad",
    "_MklConv2DWithBiasBackpropBias": "BiasAddGrad",
}


@pytest.mark.parametrize("kernel,op", RECORDED_TYPES.items())
def test_op_types_are_named_the_same_on_every_cpu(kernel, op):
  assert opstats.canonical_type(kernel) == op


def test_condensed_stats_group_kernels_of_one_op():
  rows = [{"host_or_device": "Host", "type": t, "operation": f"model/conv1/{t}",
           "total_self_time": us}
          for t, us in [("_MklNativeConv2DBackpropFilterWithBias", 60.0),
                        ("Conv2DBackpropFilter", 20.0), ("_MklNativeFusedConv2D", 15.0),
                        ("_MklCast", 5.0), ("IDLE", 1000.0)]]
  stats = opstats.condense(rows, {"layers": [{"name": "conv1"}], "float32_layers": []})
  assert [(o["type"], o["share"]) for o in stats["top_ops"]] == [
      ("Conv2DBackpropFilter", 0.8), ("Conv2D", 0.15), ("Cast", 0.05)]
  assert stats["top_ops"][0]["kernels"] == ["Conv2DBackpropFilter",
                                            "_MklNativeConv2DBackpropFilterWithBias"]
  assert stats["cast_time_share"] == 0.05 and stats["layer_time_share"] == {"conv1": 1.0}
