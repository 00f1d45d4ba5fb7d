"""The embedded default dataset: an Imagenette-shaped set of JPEGs generated offline.

Imagenette cannot be downloaded everywhere (CI, air-gapped machines), so mpt draws its
own: 10 classes under the real Imagenette wnids, written once as JPEGs in the fast.ai
layout (`train/<wnid>/*.JPEG`, `val/<wnid>/*.JPEG`) and then read by the very folder
loader that reads a downloaded `imagenette2-320`. Each class has its own shape and hue,
drawn at a random place, size and aspect ratio over a random noisy background, so the
classes are learnable but not trivially (hue is jittered, shapes vary in size), and
accuracy means something. Every image is a pure function of (seed, split, index): the
same flags give the same bytes on any machine.
"""

import colorsys
import os
import pathlib
import shutil
import uuid

import numpy as np

from mpt import console
from mpt import files

# The real Imagenette classes, in the order of their wnids.
WNIDS = ("n01440764", "n02102040", "n02979186", "n03000684", "n03028079",
         "n03394916", "n03417042", "n03425413", "n03445777", "n03888605")
VERSION = 1  # Bump when drawing changes, so stale caches are not reused.


def default_root() -> pathlib.Path:
  return files.cache_root()


def _shape_mask(label: int, yy: np.ndarray, xx: np.ndarray, r: float) -> np.ndarray:
  """Boolean mask of class `label`'s shape; yy, xx are offsets from its centre."""
  ay, ax = np.abs(yy), np.abs(xx)
  box = (ay < r) & (ax < r)
  rr = np.hypot(yy, xx)
  if label == 0: return rr < r                                   # disk
  if label == 1: return box                                      # square
  if label == 2: return (yy < r) & (ax < (yy + r) / 2)           # triangle
  if label == 3: return (rr < r) & (rr > 0.6 * r)                # ring
  if label == 4: return box & ((yy // (r / 3)) % 2 == 0)         # horizontal stripes
  if label == 5: return box & ((xx // (r / 3)) % 2 == 0)         # vertical stripes
  if label == 6: return box & ((ay < r / 3) | (ax < r / 3))      # cross
  if label == 7: return ay + ax < r                              # diamond
  if label == 8: return box & (((yy // (r / 2)) + (xx // (r / 2))) % 2 == 0)  # checker
  return (yy / (0.5 * r)) ** 2 + (xx / r) ** 2 < 1               # flat ellipse


def draw(label: int, rng: np.random.Generator, px: int) -> np.ndarray:
  """One uint8 HxWx3 image of class `label` with longest side `px`."""
  short = int(px * rng.uniform(0.7, 1.0))
  h, w = (short, px) if rng.random() < 0.7 else (px, short)  # mostly landscape
  background = rng.uniform(0.0, 1.0, size=3) * rng.uniform(0.3, 1.0)
  img = np.broadcast_to(background, (h, w, 3)).copy()
  hue = (label / len(WNIDS) + rng.normal(0.0, 0.03)) % 1.0
  colour = colorsys.hsv_to_rgb(hue, rng.uniform(0.6, 1.0), rng.uniform(0.6, 1.0))
  r = rng.uniform(0.18, 0.32) * min(h, w)
  cy, cx = rng.uniform(0.3, 0.7) * h, rng.uniform(0.3, 0.7) * w
  yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
  mask = _shape_mask(label, yy - cy, xx - cx, r)
  img[mask] = colour
  img += rng.normal(0.0, 0.08, size=img.shape)
  return (np.clip(img, 0.0, 1.0) * 255).astype(np.uint8)


def generate(root: pathlib.Path, n_train: int, n_val: int, px: int,
             seed: int) -> pathlib.Path:
  """The set's folder under `root`, drawn once per parameters into a temporary folder
  and renamed into place, so a crash or a concurrent run never leaves a half-written
  set behind that later runs would trust."""
  final = root / f"synthetic-v{VERSION}-seed{seed}-{n_train}x{n_val}-{px}px"
  if final.is_dir():
    return final
  root.mkdir(parents=True, exist_ok=True)
  tmp = root / f".{final.name}.{uuid.uuid4().hex}.tmp"
  with console.phase(f"generating the synthetic data set in {root} (once)",
                     n_train + n_val, "image") as progress:
    for split_id, (split, n) in enumerate((("train", n_train), ("val", n_val))):
      _draw_split(tmp, split_id, split, n, px, seed,
                  lambda i: progress.update(i + 1 + split_id * n_train))
  try:
    os.rename(tmp, final)
  except OSError:  # Another process finished the same set first: use theirs.
    shutil.rmtree(tmp, ignore_errors=True)
  return final


def _draw_split(tmp: pathlib.Path, split_id: int, split: str, n: int, px: int,
                seed: int, done) -> None:
  import tensorflow as tf  # Only for JPEG encoding; callers have imported it anyway.
  for wnid in WNIDS:
    (tmp / split / wnid).mkdir(parents=True)
  for i in range(n):
    label = i % len(WNIDS)
    rng = np.random.default_rng([seed, split_id, i])
    jpeg = tf.io.encode_jpeg(draw(label, rng, px), quality=90).numpy()
    (tmp / split / WNIDS[label] / f"{WNIDS[label]}_{i:06d}.JPEG").write_bytes(jpeg)
    if i % 50 == 49 or i == n - 1:
      done(i)
