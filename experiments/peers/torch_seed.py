"""The seed convnet in PyTorch, layer for layer, and its timed training step.

  python experiments/peers/torch_seed.py --image_size=64 --layout=channels_last \
      --dtype=bfloat16 --steps=30 --warmup=5 [--profile]

Prints one JSON line: the median step time after the warm-up and, with --profile, the
top ops of the timed steps by self CPU time (torch.profiler). experiments/bench_peer.py
runs it as a child per cell.

The twin of mpt's `seed_convnet` (mpt/models/convnets.py): three stride-2 convolutions
(32 5x5, 64 7x7, 128 11x11) each followed by ReLU then BatchNorm, global average pooling,
a 10-way dense layer; Adam (lr 1e-3, epsilon 1e-7 as Keras'), cross-entropy. Keras'
BatchNorm (momentum 0.9, epsilon 1e-3) is PyTorch's with momentum 0.1. Keras' "same"
padding at stride 2 pads (k-1)//2 before and k//2 after an even-sized input; PyTorch's
symmetric k//2 gives the same output shapes and the same arithmetic, one row shifted,
which a speed comparison does not see. Softmax + sparse cross-entropy in Keras is
`F.cross_entropy` on the logits here, PyTorch's idiom (one fused log-softmax).

Mixed precision is `torch.autocast("cpu", dtype)`: PyTorch's counterpart of a Keras
mixed policy (16-bit convolutions and matmuls, float32 weights, BatchNorm in float32).
"""

import argparse
import json
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F

FILTERS = ((32, 5), (64, 7), (128, 11))


class SeedConvnet(nn.Module):

  def __init__(self, num_classes: int = 10, channels: int = 3):
    super().__init__()
    layers = []
    for filters, kernel in FILTERS:
      layers += [nn.Conv2d(channels, filters, kernel, stride=2, padding=kernel // 2),
                 nn.ReLU(inplace=True), nn.BatchNorm2d(filters, eps=1e-3, momentum=0.1)]
      channels = filters
    self.features = nn.Sequential(*layers)
    self.logits = nn.Linear(channels, num_classes)

  def forward(self, x):
    x = self.features(x)
    return self.logits(torch.mean(x, dim=(2, 3)))

  def feature_shapes(self, x) -> list[tuple[int, ...]]:
    """Each BatchNorm's output shape, NHWC as Keras prints it."""
    shapes = []
    for layer in self.features:
      x = layer(x)
      if isinstance(layer, nn.BatchNorm2d):
        shapes.append((x.shape[0], x.shape[2], x.shape[3], x.shape[1]))
    return shapes


def describe(image_size: int) -> dict:
  """The twin's structure as plain data, for a comparison with Keras' model made in
  another process (PyTorch and TensorFlow must not share one: importing torch's
  triton into a process that loaded TensorFlow can crash it): parameter and
  moving-statistic counts, parameter shapes in order, each BatchNorm's output shape
  (NHWC) and (momentum, eps), the logits' shape for a batch of 2."""
  twin = SeedConvnet()
  x = torch.rand(2, 3, image_size, image_size)
  return {"parameters": sum(p.numel() for p in twin.parameters()),
          "moving": sum(b.numel() for n, b in twin.named_buffers()
                        if not n.endswith("num_batches_tracked")),
          "shapes": [list(p.shape) for p in twin.parameters()],
          "batchnorm_shapes": [list(s[1:]) for s in twin.feature_shapes(x)],
          "batchnorm": [[m.momentum, m.eps] for m in twin.modules()
                        if isinstance(m, nn.BatchNorm2d)],
          "logits": list(twin(x).shape)}


def train(image_size: int, batch_size: int, layout: str, dtype: str, steps: int,
          warmup: int, profile: bool = False, seed: int = 0) -> dict:
  torch.manual_seed(seed)
  model = SeedConvnet()
  fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
  model = model.to(memory_format=fmt)
  opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
  images = torch.rand(batch_size, 3, image_size, image_size).to(memory_format=fmt)
  labels = torch.randint(0, 10, (batch_size,))
  autocast = dtype != "float32"
  half = getattr(torch, dtype)

  def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=half, enabled=autocast):
      loss = F.cross_entropy(model(images), labels)
    loss.backward()
    opt.step()
    return loss.item()  # Materialised, as mpt's timed steps are.

  times = []
  for i in range(steps):
    if profile and i == warmup:
      prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
      prof.__enter__()
    start = time.perf_counter()
    step()
    times.append((time.perf_counter() - start) * 1e3)
  result = {"ms_per_step": statistics.median(times[warmup:]),
            "timed_steps": len(times[warmup:]), "threads": torch.get_num_threads()}
  if profile:
    prof.__exit__(None, None, None)
    rows = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in rows) or 1
    rows.sort(key=lambda e: -e.self_cpu_time_total)
    result["top_ops"] = [{"type": e.key, "share": e.self_cpu_time_total / total}
                         for e in rows[:10]]
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--image_size", type=int, default=64)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--layout", choices=["nchw", "channels_last"], default="nchw")
  parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                      default="float32")
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--warmup", type=int, default=5)
  parser.add_argument("--profile", action="store_true")
  args = parser.parse_args()
  print(json.dumps(train(args.image_size, args.batch_size, args.layout, args.dtype,
                         args.steps, args.warmup, args.profile)))


if __name__ == "__main__":
  main()
