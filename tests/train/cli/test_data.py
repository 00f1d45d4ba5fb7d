"""The input pipeline: folder loader on real JPEG files, bad layouts, TFDS offline."""

import dataclasses
import io
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from mpt import config
from mpt.train.cli import data
from mpt.train.cli import synthetic
from mpt.errors import UserError


def _jpeg(array: np.ndarray, mode: str | None = None) -> bytes:
  buf = io.BytesIO()
  image = Image.fromarray(array)
  (image.convert(mode) if mode else image).save(buf, format="JPEG")
  return buf.getvalue()


@pytest.fixture
def tree(tmp_path) -> pathlib.Path:
  """A tiny imagenette-layout folder with the awkward files real data has."""
  rng = np.random.default_rng(0)
  rgb = lambda h, w: rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
  root = tmp_path / "imagenette2-tiny"
  for split, n in (("train", 3), ("val", 2)):
    for cls in ("n01440764", "n02102040"):
      (root / split / cls).mkdir(parents=True)
      for i in range(n):
        (root / split / cls / f"{cls}_{i}.JPEG").write_bytes(_jpeg(rgb(30 + i, 47)))
  cls_dir = root / "train" / "n02102040"
  (cls_dir / "gray.JPEG").write_bytes(_jpeg(rgb(20, 20)[..., 0]))
  (cls_dir / "cmyk.JPEG").write_bytes(_jpeg(rgb(25, 33), mode="CMYK"))
  png = io.BytesIO()
  Image.fromarray(rgb(16, 16)).save(png, format="PNG")
  (cls_dir / "png_in_disguise.JPEG").write_bytes(png.getvalue())
  good = _jpeg(rgb(40, 40))
  (root / "train" / "n01440764" / "corrupt.JPEG").write_bytes(good[: len(good) // 3])
  (root / "train" / "n01440764" / "notes.txt").write_text("not an image")
  return root


def test_folder_loader_decodes_everything_and_skips_corrupt_files(tree):
  cfg = config.Config(dataset=f"folder:{tree}", image_size=24, batch_size=4)
  d = data.load(cfg)
  assert d.class_names == ["n01440764", "n02102040"]
  assert (d.n_train, d.n_val) == (3 + 3 + 3, 4)  # 10 image files, the corrupt one out
  assert [pathlib.Path(p).name for p in d.skipped_files] == ["corrupt.JPEG"]
  assert d.steps_per_epoch == 3  # ceil(9 / 4)
  images, labels = next(iter(d.train_from(0)))
  assert images.shape == (4, 24, 24, 3) and images.dtype == tf.float32
  assert labels.dtype == tf.int32
  val = list(d.val)
  assert [int(x.shape[0]) for x, _ in val] == [4]
  everything = np.concatenate([x.numpy() for x, _ in d.val.unbatch().batch(100)])
  assert 0.0 <= everything.min() and everything.max() <= 1.0


def test_training_stream_is_endless_and_seeded(tree):
  cfg = config.Config(dataset=f"folder:{tree}", image_size=8, batch_size=3, seed=5)
  first = [y.numpy().tolist() for _, y in data.load(cfg).train_from(0).take(7)]
  again = [y.numpy().tolist() for _, y in data.load(cfg).train_from(0).take(7)]
  assert len(first) == 7 and first == again  # 7 batches > one pass of 9 images
  reseeded = data.load(dataclasses.replace(cfg, seed=6))
  other = [y.numpy().tolist() for _, y in reseeded.train_from(0).take(7)]
  assert other != first  # Another seed, another order.


def _pipeline_ops(ds) -> tuple[set[str], list[int]]:
  """The op types of a dataset's graph, its functions' bodies included, and the int
  constants of the functions that hold a loop condition (`Less`)."""
  from tensorflow.core.framework import graph_pb2
  graph = graph_pb2.GraphDef()
  graph.ParseFromString(ds._as_serialized_graph().numpy())
  ops = {n.op for n in graph.node}
  bounds = []
  for fn in graph.library.function:
    ops |= {n.op for n in fn.node_def}
    if any(n.op == "Less" for n in fn.node_def):
      bounds += [int(tf.make_ndarray(n.attr["value"].tensor)) for n in fn.node_def
                 if n.op == "Const" and n.attr["dtype"].type == tf.int32.as_datatype_enum]
  return ops, bounds


def test_input_work_adds_work_but_leaves_the_batches_as_they_were(tree):
  cfg = config.Config(dataset=f"folder:{tree}", image_size=8, batch_size=3, seed=5)
  loaded = data.load(cfg)
  plain = [(x.numpy(), y.numpy()) for x, y in loaded.train_from(0).take(4)]
  slow = data.load(dataclasses.replace(cfg, input_work=3))
  worked = [(x.numpy(), y.numpy()) for x, y in slow.train_from(0).take(4)]
  for (x0, y0), (x1, y1) in zip(plain, worked):
    np.testing.assert_array_equal(x0, x1)
    np.testing.assert_array_equal(y0, y1)
  # The work is in the training pipeline (a blur loop of 3 passes), not in the plain
  # one's, nor in either validation pipeline.
  ops, bounds = _pipeline_ops(slow.train_from(0))
  assert "DepthwiseConv2dNative" in ops and 3 in bounds, (sorted(ops), bounds)
  for ds in (loaded.train_from(0), loaded.val, slow.val):
    assert "DepthwiseConv2dNative" not in _pipeline_ops(ds)[0]


@pytest.mark.parametrize("mutate,words", [
    (lambda root: root / "missing", "does not exist; expected PATH/train/<class>"),
    (lambda root: (shutil_rm(root / "val"), root)[1], "has no val/ folder"),
    (lambda root: (shutil_rm(root / "val" / "n02102040"),
                   (root / "val" / "zebra").mkdir(), root)[2], "not in train/: ['zebra']"),
])
def test_bad_layouts_say_what_was_expected(tree, mutate, words):
  cfg = config.Config(dataset=f"folder:{mutate(tree)}")
  with pytest.raises(UserError) as e:
    data.load(cfg)
  assert words in str(e.value)


def shutil_rm(path):
  import shutil
  shutil.rmtree(path)


def test_empty_split_is_an_error(tmp_path):
  for split in ("train", "val"):
    (tmp_path / split / "a").mkdir(parents=True)
  (tmp_path / "train" / "a" / "x.jpg").write_bytes(_jpeg(np.zeros((4, 4, 3), np.uint8)))
  with pytest.raises(UserError, match="val holds no images"):
    data.load(config.Config(dataset=f"folder:{tmp_path}"))


def test_offline_tfds_asks_whether_the_data_is_prepared_before_any_network(
    tmp_path, monkeypatch):
  # Offline, tfds.load retries DNS for minutes: the promise "stops within a second"
  # holds because nothing reaches for the network before the prepared-data check.
  import socket
  import tensorflow_datasets as tfds
  calls = []

  def no_network(*args, **kwargs):
    calls.append(("network", args[:1]))
    raise OSError("the test forbids network access")
  monkeypatch.setattr(socket, "getaddrinfo", no_network)
  monkeypatch.setattr(socket.socket, "connect", no_network)
  is_prepared = tfds.core.DatasetBuilder.is_prepared
  monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared",
                      lambda self: calls.append(("is_prepared",)) or is_prepared(self))
  for fetch in ("download_and_prepare", "as_dataset"):
    monkeypatch.setattr(tfds.core.DatasetBuilder, fetch,
                        lambda self, *a, fetch=fetch, **k: calls.append((fetch,)))
  cfg = config.Config(dataset="imagenette/320px", data_dir=str(tmp_path))
  with pytest.raises(UserError) as e:
    data.load(cfg)
  assert calls == [("is_prepared",)]
  message = str(e.value)
  for hint in ("not prepared", str(tmp_path), "--data_dir", "--download", "folder:",
               "synthetic"):
    assert hint in message


def test_unknown_dataset_lists_the_choices():
  with pytest.raises(UserError, match="valid: synthetic, folder:PATH, or a TFDS name"):
    data.load(config.Config(dataset="imagenettx"))


def test_synthetic_set_is_deterministic_and_in_the_imagenette_layout(tmp_path):
  a = synthetic.generate(tmp_path / "a", 20, 10, 48, seed=3)
  b = synthetic.generate(tmp_path / "b", 20, 10, 48, seed=3)
  files = sorted(p.relative_to(a) for p in a.rglob("*.JPEG"))
  assert len(files) == 30
  assert {p.parts[1] for p in files} == set(synthetic.WNIDS)
  assert all((a / p).read_bytes() == (b / p).read_bytes() for p in files)
  assert synthetic.generate(tmp_path / "a", 20, 10, 48, seed=3) == a  # cached
  other = synthetic.generate(tmp_path / "a", 20, 10, 48, seed=4)
  assert (other / files[0]).read_bytes() != (a / files[0]).read_bytes()


def test_synthetic_classes_differ_in_colour_and_shape():
  # Per-class mean images over many draws: every pair of classes must be apart.
  means = []
  for label in range(10):
    imgs = [synthetic.draw(label, np.random.default_rng([9, label, i]), 32)
            for i in range(30)]
    means.append(np.mean([img[:20, :20].astype(float) for img in imgs], axis=0))
  gaps = [np.abs(means[i] - means[j]).mean() for i in range(10) for j in range(i)]
  assert min(gaps) > 2.0


def _labels(d, n: int) -> list[int]:
  return [int(y) for _, y in d.train_from(0).unbatch().take(n)]


def test_shuffle_buffer_sets_how_far_the_stream_mixes(tree):
  """--shuffle_buffer=1 leaves the source's order (the classes' folders in turn), one
  pass after another; the default (the whole set in the buffer) mixes it."""
  cfg = config.Config(dataset=f"folder:{tree}", image_size=8, batch_size=1, seed=5)
  one = _labels(data.load(dataclasses.replace(cfg, shuffle_buffer=1)), 18)
  assert one == ([0] * 3 + [1] * 6) * 2, one
  whole = _labels(data.load(cfg), 18)
  assert whole != one and set(whole) == {0, 1}, whole


@pytest.mark.parametrize("cache", ["memory", "none", "file"])
def test_cache_keeps_the_resized_images_where_asked(tree, tmp_path, cache):
  """--cache: in memory (a cache op, no files), none (no cache op: each pass decodes
  again), or a file prefix (TensorFlow's cache files per split and size)."""
  prefix = tmp_path / "cached" / "imgs"
  prefix.parent.mkdir()
  flag = str(prefix) if cache == "file" else cache
  cfg = config.Config(dataset=f"folder:{tree}", image_size=8, batch_size=3, seed=5,
                      cache=flag)
  d = data.load(cfg)
  assert len(_labels(d, 9)) == 9
  ops = _pipeline_ops(d.train_from(0))[0]
  assert any(op.startswith("CacheDataset") for op in ops) == (cache != "none"), ops
  written = sorted(p.name for p in prefix.parent.iterdir())
  if cache == "file":
    assert {n.split(".")[0] for n in written} == {"imgs_train_8px", "imgs_val_8px"}, written
    assert any(n.endswith(".index") for n in written)
  else:
    assert written == []
