"""What a GPU kernel is, by family (mpt/records/gpu.py FAMILIES), from its name and
the type of the op it ran for: which families Tensor Cores can run (`ELIGIBLE`) and
which are bound by memory (`MEMORY_BOUND`: mixed precision can at most halve their
bytes). Read by mpt/machine/gpu_profile.py.

A kernel's name decides first where it says what the kernel does whatever op launched
it (a layout transpose inside a Conv2D, cuDNN's autotuner); then the op type, TF's
("Conv2D", "_FusedConv2D", "FusedBatchNormGradV3") or XLA's ("dot_general"); then,
for a kernel no op type placed, its name again (cuDNN, cuBLAS, Eigen, XLA fusions).

`tensor_core` says from a kernel's name whether it ran on Tensor Cores. xprof 2.24
decides that from a list of Volta and Turing name prefixes (volta_h884gemm,
turing_fp16_s1688cudnn), so on an Ampere or Hopper GPU it flags no kernel at all:
the real H200 captures in tests/data/gpu_captures (cuDNN's sm80_xmma_*/sm90_xmma_*
and CUTLASS TensorOp kernels, float32 ones on TF32) show it.
"""

import re

MEMORY_BOUND = {"batchnorm", "elementwise", "cast", "transpose", "copy", "reduction",
                "random"}
ELIGIBLE = {"conv", "matmul"}  # What Tensor Cores can run.

# By kernel name, before the op: what the kernel does whatever op launched it.
_BY_KERNEL = (
    ("transpose", r"nchwToNhwc|nhwcToNchw|[Tt]ranspose|SwapDimension|ShuffleInTensor"),
    # cuDNN's and XLA's helpers around a convolution: layout and type conversions,
    # padding the channels to a Tensor Core multiple, split-K's final sum.
    ("cast", r"convertTensor_kernel|^wrapped_convert|^loop_convert_fusion"),
    ("copy", r"AddPaddingKernel"),
    ("reduction", r"ReduceSplitK"),
    ("copy", r"^Mem(cpy|set)|[Cc]opy"),
    ("other", r"redzone_checker"),  # cuDNN's autotuner checking its buffers.
)
# By op type (TF's, or XLA's last name component), first match wins.
_BY_OP = (
    ("conv", r"^_?(Fused)?(Conv[23]D|DepthwiseConv)|conv_general_dilated|^convolution"),
    ("matmul", r"^_?(Fused)?(Batch)?MatMul|^Einsum|dot_general|^dot$"),
    ("batchnorm", r"^_?FusedBatchNorm|BatchNorm"),
    ("cast", r"^Cast$|convert_element_type"),
    ("transpose", r"^(Conjugate)?Transpose|^transpose$"),
    ("random", r"^(Random|StatelessRandom|TruncatedNormal|Multinomial)|rng|random"),
    # Pooling too: a window reduction, bound by memory like the rest.
    ("reduction", r"^(Sum|Mean|Max|Min|Prod|All|Any|reduce_\w+)$|^(ArgM|BiasAddGrad"
                  r"|L2Loss|(Log)?Softmax|(Sparse)?SoftmaxCross|Reduce|Segment|Unsorted"
                  r"|Cumsum|TopK|MaxPool|AvgPool)"),
    ("copy", r"^(_Send|_Recv|Identity|Snapshot|Concat|Pack|Unpack|Split|Slice"
             r"|StridedSlice|Pad|MirrorPad|Tile|Gather|ResourceGather|ScatterNd|Reverse"
             r"|BroadcastTo|DynamicStitch|OneHot|concatenate|dynamic_slice|pad|gather)"),
    ("elementwise", r"^(Add|Sub|Mul|Div|RealDiv|Floor|Maximum|Minimum|Relu|Elu|Selu"
                    r"|LeakyRelu|Gelu|Sigmoid|Tanh|Softplus|BiasAdd|Square|Sqrt|Rsqrt"
                    r"|Exp|Log|Neg|Pow|Reciprocal|Inv|Abs|Sign|Ceil|Round|Erf|Select"
                    r"|Where|Greater|Less|Equal|NotEqual|Logical|ClipByValue|Fill"
                    r"|ZerosLike|OnesLike|Xdivy|Xlogy|Is(Finite|Nan|Inf)|Apply"
                    r"|ResourceApply|Assign)"),
)
# A kernel no op type placed, by its name (cuDNN, cuBLAS, Eigen, XLA fusions).
_FALLBACK = (
    ("batchnorm", r"bn_fw|bn_bw|batch_?norm"),
    ("conv", r"conv|scudnn|winograd|wgrad|dgrad|fft2d"),
    ("matmul", r"gemm|hmma|xmma|dot"),
    ("random", r"[Pp]hilox|curand|random"),
    ("reduction", r"[Rr]educe|pooling|BiasGrad"),
    ("elementwise", r"EigenMetaKernel|_fusion|elementwise|Bias\w*Kernel|Apply\w+Kernel"),
)
_RE = {table: [(f, re.compile(p)) for f, p in rules]
       for table, rules in (("kernel", _BY_KERNEL), ("op", _BY_OP),
                            ("fallback", _FALLBACK))}


# Tensor Core kernels by name: the MMA families (xmma, hmma, imma; gmma and Hopper's
# warpgroup kernels), the MMA instruction shapes cuDNN and cuBLAS put in names
# (h884, s1688, 16816, "tensor16x8x16"), CUTLASS's TensorOp, cuBLASLt's nvjet (Hopper).
_TENSOR_CORE = re.compile(r"xmma|hmma|imma|gmma|warpgroup|[hsi](?:884|1688|16816)"
                          r"|tensor\d+x\d+x\d+|MmaTensorOp|tensorop|nvjet")
# ... but not their float32-math variants (xmma's "f32f32_f32f32") nor CUTLASS's SIMT.
_NOT_TENSOR_CORE = re.compile(r"f32f32_f32f32|[Ss]imt")


def tensor_core(kernel: str) -> bool:
  """Whether the kernel's name says it ran on Tensor Cores."""
  return bool(_TENSOR_CORE.search(kernel)) and not _NOT_TENSOR_CORE.search(kernel)


def family(op_type: str, kernel: str = "") -> str:
  """The family (records.gpu.FAMILIES) of a kernel, from its name and op type."""
  for table, text in (("kernel", kernel), ("op", op_type), ("fallback", kernel)):
    found = next((f for f, rule in _RE[table] if text and rule.search(text)), None)
    if found:
      return found
  return "other"
