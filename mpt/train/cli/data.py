"""Input pipeline: one tf.data pipeline that serves both training loops.

`--dataset` picks the source:
  synthetic    generated JPEGs (mpt/train/cli/synthetic.py), read by the folder loader below;
  folder:PATH  a downloaded imagenette2-320, or any PATH/{train,val}/<class>/<images>;
  NAME         a TFDS dataset such as imagenette/320px (`--data_dir`, `--download`).

The pipeline is the seed's: decode, resize to image_size x image_size, scale to [0, 1]
in float32, cache, shuffle, batch, prefetch; validation is resized, scaled and batched.
The cache is filled by one pass before training starts, so decoding never lands in
the timed steps, and that pass also finds corrupt or unreadable files: they are
skipped, named in the log and counted in summary.json (`skipped_files`).

The training set repeats: an epoch is `steps_per_epoch` full batches taken from one
endless shuffled stream, so every step of both loops has the same static batch shape
(no retracing, no partial last batch in the timings). `--input_work=N` adds N blur
passes per training example after the cache: a deliberately slow input pipeline.
"""

import dataclasses
import math
import pathlib
from typing import Callable

from absl import logging
import tensorflow as tf

from mpt import console
from mpt.config import Config
from mpt.errors import UserError
from mpt.train.cli import synthetic

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".gif")
LAYOUT = "PATH/train/<class>/*.JPEG and PATH/val/<class>/*.JPEG (the imagenette2-320 layout)"


@dataclasses.dataclass
class Data:
  # Builds the endless stream of (image float32 [0,1] NHWC, label int32) batches.
  make_train: Callable[[], tf.data.Dataset]
  val: tf.data.Dataset  # one pass of batches, the last one possibly partial
  class_names: list[str]
  n_train: int  # usable examples, after skipping unreadable files
  n_val: int
  steps_per_epoch: int
  skipped_files: list[str]
  source: str  # where the data came from, for the log and summary.json

  def train_from(self, step: int) -> tf.data.Dataset:
    """The training stream from global step `step` on, as a fresh pipeline: a pure
    function of the seed (repeat, then a seeded shuffle that does not reshuffle), so
    skipping `step` batches puts a resumed run exactly where the checkpointed one was."""
    return self.make_train().skip(step)


def _list_folder(root: pathlib.Path) -> tuple[dict[str, tuple[list[str], list[int]]],
                                              list[str]]:
  """Returns {split: (paths, labels)} and the class names of a folder dataset."""
  if not root.is_dir():
    raise UserError(f"folder dataset {str(root)!r} does not exist; expected {LAYOUT}")
  for split in ("train", "val"):
    if not (root / split).is_dir():
      raise UserError(f"folder dataset {str(root)!r} has no {split}/ folder; "
                      f"expected {LAYOUT}")
  classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
  if not classes:
    raise UserError(f"{root / 'train'} has no class folders; expected {LAYOUT}")
  splits = {}
  for split in ("train", "val"):
    extra = {p.name for p in (root / split).iterdir() if p.is_dir()} - set(classes)
    if extra:
      raise UserError(f"{root / split} has classes not in train/: {sorted(extra)}")
    paths, labels = [], []
    for label, name in enumerate(classes):
      folder = root / split / name
      files = sorted(f for f in folder.iterdir()
                     if f.suffix.lower() in IMAGE_EXTENSIONS) if folder.is_dir() else []
      paths += [str(f) for f in files]
      labels += [label] * len(files)
    if not paths:
      raise UserError(f"{root / split} holds no images ({', '.join(IMAGE_EXTENSIONS)});"
                      f" expected {LAYOUT}")
    splits[split] = (paths, labels)
  return splits, classes


def _decode(path: tf.Tensor) -> tf.Tensor:
  # decode_image sniffs the format (ImageNet has PNGs named .JPEG), and channels=3
  # turns grayscale and CMYK JPEGs into RGB.
  return tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)


def _folder_source(root: pathlib.Path):
  splits, classes = _list_folder(root)
  sources = {}
  for split, (paths, labels) in splits.items():
    ds = tf.data.Dataset.from_tensor_slices((paths, labels, tf.range(len(paths))))
    sources[split] = (ds.map(lambda p, y, i: (_decode(p), y, i),
                             num_parallel_calls=tf.data.AUTOTUNE, deterministic=True),
                      paths)
  return sources["train"], sources["val"], classes


def _tfds_source(cfg: Config):
  import tensorflow_datasets as tfds  # Imported only when asked for: it is slow.
  name = cfg.dataset
  # Community datasets are left out: listing them asks GCS, which hangs offline.
  if name.split("/")[0].split(":")[0] not in tfds.list_builders(
      with_community_datasets=False):
    raise UserError(f"unknown --dataset={name!r}; valid: synthetic, folder:PATH, or a "
                    "TFDS name such as imagenette/320px")
  builder = tfds.builder(name, data_dir=cfg.data_dir or None)
  if not builder.is_prepared():
    if not cfg.download:
      # Checked before tfds.load, which would otherwise retry DNS for minutes offline.
      raise UserError(
          f"TFDS dataset {name!r} is not prepared in {builder.data_dir}; pass "
          f"--data_dir=DIR where it was prepared, --download to fetch it, "
          f"--dataset=folder:PATH for a downloaded imagenette2-320, or "
          f"--dataset=synthetic")
    builder.download_and_prepare()
  val_split = next(s for s in ("validation", "test", "train") if s in builder.info.splits)
  train, val = ((builder.as_dataset(split=split, as_supervised=True, shuffle_files=False)
                 .enumerate().map(lambda i, xy: (xy[0], tf.cast(xy[1], tf.int32), i)), None)
                for split in ("train", val_split))
  return train, val, list(builder.info.features["label"].names)


def _prep(size: int):
  """Resize to size x size and scale to [0, 1] (a grayscale image made RGB)."""
  def prep(image, label, index):
    if image.shape.rank == 3 and image.shape[-1] == 1:
      image = tf.image.grayscale_to_rgb(image)
    image = tf.image.resize(image, (size, size)) / 255.0
    return tf.ensure_shape(image, (size, size, 3)), label, index
  return prep


def _resize_cache_count(source, cfg: Config, split: str):
  """(the cached (image, label) dataset of one split, its size, its skipped files),
  by the one pass that fills the cache (the module docstring)."""
  ds, paths = source
  size = cfg.image_size
  ds = ds.map(_prep(size), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  ds = ds.ignore_errors()  # An undecodable file drops out here; found missing below.
  if cfg.cache != "none":
    ds = ds.cache("" if cfg.cache == "memory" else f"{cfg.cache}_{split}_{size}px")
  seen = set()
  with console.phase(f"reading and caching the {split} split at {size} px",
                     len(paths) if paths is not None else None, "image") as progress:
    for _, _, index in ds.batch(256):
      seen.update(index.numpy().tolist())
      progress.update(len(seen))
  skipped = [path for i, path in enumerate(paths or []) if i not in seen]
  for path in skipped[:10]:
    logging.warning("skipped unreadable image %s", path)
  if len(skipped) > 10:
    logging.warning("... and %d more unreadable images", len(skipped) - 10)
  if not seen:
    raise UserError(f"no readable images in the {split} split of {cfg.dataset!r}")
  # ignore_errors hides the length; restore it so Keras knows where an epoch ends.
  ds = ds.map(lambda x, y, i: (x, y)).apply(
      tf.data.experimental.assert_cardinality(len(seen)))
  return ds, len(seen), skipped


def _input_work(passes: int):
  """`--input_work`'s blur passes, discarded: they enter the image as `+ 0 *
  sum(blurred)`, and a float multiply by zero is not folded away (NaN * 0 is NaN), so
  tf.data's graph optimisations keep the work."""
  kernel = tf.fill((3, 3, 3, 1), 1.0 / 9.0)

  def work(image, label):
    blurred = tf.while_loop(
        lambda i, x: i < passes,
        lambda i, x: (i + 1, tf.nn.depthwise_conv2d(x, kernel, [1, 1, 1, 1], "SAME")),
        (tf.constant(0), image[None]))[1]
    return image + 0.0 * tf.reduce_sum(blurred), label
  return work


def _shard_by_data(ds: tf.data.Dataset) -> tf.data.Dataset:
  """Multi-worker runs split each global batch across workers by element: the sources
  are file names read inside a map, not file readers, so AUTO sharding would try
  files, fail and fall back to this with a warning."""
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = (
      tf.data.experimental.AutoShardPolicy.DATA)
  return ds.with_options(options)


def _root(cfg: Config) -> pathlib.Path | None:
  """The folder of a synthetic (generated here once) or folder: dataset; None: TFDS."""
  if cfg.dataset == "synthetic":
    return synthetic.generate(
        pathlib.Path(cfg.data_dir).expanduser() if cfg.data_dir
        else synthetic.default_root(),
        cfg.synthetic_train, cfg.synthetic_val, cfg.synthetic_px, cfg.seed)
  if cfg.dataset.startswith("folder:"):
    return pathlib.Path(cfg.dataset[len("folder:"):]).expanduser()
  return None


def first_batches(cfg: Config, n: int) -> tuple[list, list[str]]:
  """([n training batches of (images, labels)], the class names), without the pass
  that caches and counts a whole split (`--mode=inspect`'s numerics): the first
  examples of a seeded shuffle of the training files (of the split's first 4096
  examples for TFDS), decoded, resized and scaled as the run's are."""
  root, count = _root(cfg), n * cfg.batch_size
  if root is None:
    (ds, _), _, classes = _tfds_source(cfg)
    ds = ds.take(4096).shuffle(4096, seed=cfg.seed)
  else:
    splits, classes = _list_folder(root)
    paths, labels = splits["train"]
    order = tf.random.experimental.stateless_shuffle(
        tf.range(len(paths)), seed=(cfg.seed, 0))[:count * 2].numpy()
    ds = tf.data.Dataset.from_tensor_slices(
        ([paths[i] for i in order], [labels[i] for i in order], order))
    ds = ds.map(lambda p, y, i: (_decode(p), y, i))
  ds = ds.map(_prep(cfg.image_size)).ignore_errors().map(lambda x, y, i: (x, y))
  return list(ds.batch(cfg.batch_size, drop_remainder=True).take(n)), classes


def load(cfg: Config) -> Data:
  """Builds the train and validation pipelines for `cfg.dataset`."""
  spec, root = cfg.dataset, _root(cfg)
  if root is not None:
    train_src, val_src, classes = _folder_source(root)
    source = f"{'synthetic' if spec == 'synthetic' else 'folder'} ({root})"
  else:
    train_src, val_src, classes = _tfds_source(cfg)
    source = f"tfds {spec}"

  train, n_train, skipped_train = _resize_cache_count(train_src, cfg, "train")
  val, n_val, skipped_val = _resize_cache_count(val_src, cfg, "val")
  buffer = cfg.shuffle_buffer or n_train
  # Repeat, then shuffle with a fixed seed: one endless stream that every iterator
  # of the dataset sees the same (Keras reads a batch from a first iterator to build
  # the model under a strategy; a reshuffling shuffle would give the next another
  # order). With the whole set in the buffer, the epoch boundaries blur a little.
  def stream():
    ds = train.repeat().shuffle(buffer, seed=cfg.seed, reshuffle_each_iteration=False)
    if cfg.input_work:  # After the cache, so that every step pays for it.
      ds = ds.map(_input_work(cfg.input_work), num_parallel_calls=tf.data.AUTOTUNE,
                  deterministic=True)
    return ds

  make_train = lambda: _shard_by_data(
      stream().batch(cfg.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
  val = _shard_by_data(val.batch(cfg.batch_size).prefetch(tf.data.AUTOTUNE))
  steps = min(math.ceil(n_train / cfg.batch_size), cfg.steps_per_epoch or math.inf)
  return Data(make_train=make_train, val=val, class_names=classes, n_train=n_train,
              n_val=n_val, steps_per_epoch=steps, skipped_files=skipped_train + skipped_val,
              source=source)
