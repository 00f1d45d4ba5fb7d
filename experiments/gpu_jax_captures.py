"""Real Tensor Core captures for mpt's tests, made where a GPU and JAX are and TensorFlow
is not (the device machine of DEVELOPERS.md "GPUs"): the seed convnet in Keras 3 on its
JAX backend, trained under float32, mixed_float16 and mixed_bfloat16, with a short
profile window each. JAX's profiler writes the same XSpace (`*.xplane.pb`) TensorFlow's
does, so mpt's GPU reader (mpt/machine/gpu_profile.py) reads these as it reads a TF one.

    KERAS_BACKEND=jax python experiments/gpu_jax_captures.py OUT [--batches=32,128]
        [--image=256]   (a small --image and batch: a smoke test on a CPU)

Writes, for the largest batch, OUT/<policy>/plugins/profile/<time>/<host>.xplane.pb
(PROFILE_STEPS steps after warm-up, each in a StepTraceAnnotation so xprof finds the
steps), and OUT/timings.json: each policy's median ms/step per batch size, timed in
interleaved rounds after warm-up, with the GPU, the versions and the settings. The
model is mpt's `seed_convnet` (mpt/models/convnets.py) layer for layer; a test builds
both and compares them (tests/machine/test_gpu_jax_captures.py), since mpt itself
cannot be imported without TensorFlow.
"""

import json
import os
import pathlib
import platform
import statistics
import sys
import time

if __name__ == "__main__":  # Not when a test imports it: its children would inherit.
  os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
IMAGE = 256  # The seed's resize (../shared/SEED-NOTES.md).
CLASSES = 10
WARMUP_STEPS = 5
ROUNDS = 5
STEPS_PER_ROUND = 20
PROFILE_STEPS = 3


def seed_convnet(input_shape, num_classes=CLASSES, bn_momentum=0.9) -> keras.Model:
  """mpt's seed_convnet, restated without mpt (which imports TensorFlow)."""
  inputs = keras.Input(input_shape, name="image")
  x = inputs
  for i, (filters, kernel) in enumerate(((32, 5), (64, 7), (128, 11)), start=1):
    x = keras.layers.Conv2D(filters, kernel, strides=2, padding="same",
                            activation="relu", name=f"conv{i}")(x)
    x = keras.layers.BatchNormalization(momentum=bn_momentum, name=f"bn{i}")(x)
  x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
  x = keras.layers.Dense(num_classes, name="logits")(x)
  outputs = keras.layers.Activation("softmax", dtype="float32", name="probs")(x)
  return keras.Model(inputs, outputs, name="seed_convnet")


def compiled(policy: str, image: int) -> keras.Model:
  """The seed's training set-up (Adam, sparse cross-entropy, accuracy) under `policy`;
  Keras wraps the optimizer in a LossScaleOptimizer under mixed_float16."""
  keras.mixed_precision.set_global_policy(policy)
  keras.utils.set_random_seed(0)
  model = seed_convnet((image, image, 3))
  model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                metrics=["accuracy"])
  keras.mixed_precision.set_global_policy("float32")
  return model


def batch(size: int, image: int):
  import jax
  rng = np.random.default_rng(size)
  x = rng.random((size, image, image, 3), dtype=np.float32)
  y = rng.integers(0, CLASSES, size).astype(np.int32)
  return jax.device_put(x), jax.device_put(y)


def timed(model, data, steps: int) -> list[float]:
  """ms per step; train_on_batch returns its logs as numpy, so each call waits for the
  GPU to finish the step."""
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    model.train_on_batch(*data)
    times.append((time.perf_counter() - start) * 1e3)
  return times


def profile(model, data, folder: pathlib.Path) -> None:
  import jax
  try:  # Host Python calls would swell the capture; TraceMe (the steps) stays.
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    jax.profiler.start_trace(str(folder), profiler_options=options)
  except (AttributeError, TypeError):
    jax.profiler.start_trace(str(folder))
  for step in range(PROFILE_STEPS):
    with jax.profiler.StepTraceAnnotation("train", step_num=step):
      model.train_on_batch(*data)
  jax.profiler.stop_trace()


def measure(batches: list[int], image: int, out: pathlib.Path) -> dict:
  result = {}
  for size in batches:
    data = batch(size, image)
    models = {p: compiled(p, image) for p in POLICIES}
    for model in models.values():
      timed(model, data, WARMUP_STEPS)  # compiles, autotunes
    times = {p: [] for p in POLICIES}
    for _ in range(ROUNDS):  # Interleaved: drift hits every policy alike.
      for p, model in models.items():
        times[p] += timed(model, data, STEPS_PER_ROUND)
    result[str(size)] = {p: round(statistics.median(t), 3) for p, t in times.items()}
    print(f"batch {size}: " + ", ".join(
        f"{p} {ms:.2f} ms" for p, ms in result[str(size)].items()), flush=True)
    if size == max(batches):
      for p, model in models.items():
        profile(model, data, out / p)
  return result


def environment() -> dict:
  import jax
  import jaxlib
  devices = jax.devices()
  return {"gpu": getattr(devices[0], "device_kind", str(devices[0])),
          "platform": devices[0].platform, "jax": jax.__version__,
          "jaxlib": jaxlib.__version__, "keras": keras.__version__,
          "python": platform.python_version(),
          "default_matmul_precision": str(jax.config.jax_default_matmul_precision),
          "xla_flags": os.environ.get("XLA_FLAGS", "")}


def main(argv: list[str]) -> int:
  out = pathlib.Path(argv[1]).resolve()
  batches, image = [128], IMAGE
  for arg in argv[2:]:
    name, _, value = arg.partition("=")
    if name == "--batches":
      batches = [int(b) for b in value.split(",")]
    elif name == "--image":
      image = int(value)
    else:
      raise SystemExit(f"unknown argument {arg}")
  out.mkdir(parents=True, exist_ok=True)
  env = environment()
  print(json.dumps(env), flush=True)
  record = {"environment": env, "image": image, "warmup_steps": WARMUP_STEPS,
            "rounds": ROUNDS, "steps_per_round": STEPS_PER_ROUND,
            "profile_steps": PROFILE_STEPS, "ms_per_step": measure(batches, image, out)}
  (out / "timings.json").write_text(json.dumps(record, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
