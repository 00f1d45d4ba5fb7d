"""What a run declares to TensorBoard's HParams and Custom Scalars dashboards.

HParams: the run's hparams (`hp.hparams`, the session) and the experiment they belong
to (`hp.hparams_config_pb`): the hparams, each with its domain where one is known, the
ones runs are compared by first (LEAD), and as
metrics only the `final/*` scalars, the run's headline figures written at its end.
Without the declaration TensorBoard makes every scalar tag of every run a metric
column (perf/..., util/..., precision/...). Each run writes the same declaration into
its own folder: TensorBoard takes the first it finds, so any subset of runs shows.

Custom Scalars: one chart per metric with train and eval on it (`train/loss` and
`eval/loss`; the same for accuracy); TensorBoard merges the identical layouts of all
runs into one.
"""

from typing import Any

import tensorflow as tf
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import summary as custom_scalar
from tensorboard.plugins.hparams import api as hp

from mpt import config

# The run's headline figures (summary.json keys), written as `final/<key>` at its end:
# the HParams dashboard's metrics, and its only ones.
FINAL = ("ms_per_step", "images_per_sec", "val_accuracy")
METRICS = tuple(f"final/{key}" for key in FINAL)
LAYOUT = layout_pb2.Layout(category=[layout_pb2.Category(
    title="train vs eval", chart=[
        layout_pb2.Chart(title=name, multiline=layout_pb2.MultilineChartContent(
            tag=[rf"^(train|eval)/{name}$"]))
        for name in ("loss", "accuracy")])])
INT_MAX = 2**31 - 1


def declared(hparams: dict[str, Any]) -> list[hp.HParam]:
  """The HParams of a run's `hparams` (Config field names), with their flag's help. The
  domain tells TensorBoard's filter what to offer: a flag's choices or a bool's two
  values as checkboxes, an int as a number range (min..max boxes); a free string (model,
  dataset, model options) has none, and is listed without a filter."""
  flags = {f.name: f for f in config.fields()}
  out = []
  for name, value in hparams.items():
    meta = flags[name].metadata if name in flags else {}
    if meta.get("choices"):
      domain = hp.Discrete(list(meta["choices"]))
    elif isinstance(value, bool):
      domain = hp.Discrete([False, True])
    elif isinstance(value, int):
      domain = hp.IntInterval(int(meta.get("lower_bound") or 0), INT_MAX)
    else:
      domain = None
    out.append(hp.HParam(name, domain, description=meta.get("help")))
  return out


def write(hparams: dict[str, Any] | None) -> None:
  """Into the default summary writer, at step 0: the custom-scalars layout and, given
  the run's hparams, the HParams experiment and session."""
  tf.summary.experimental.write_raw_pb(
      custom_scalar.pb(LAYOUT).SerializeToString(), step=0)
  if hparams:
    tf.summary.experimental.write_raw_pb(_experiment(hparams).SerializeToString(),
                                         step=0)
    hp.hparams(hparams)


# The hparams a run is compared by, shown first. TensorBoard (2.21) lists a declared
# experiment's hparams sorted by (not `differs`, name) and its dashboard ticks only the
# first five: by name alone those are batch_size, batchnorm, dataset, image_size and
# jit_compile, with policy, loop, model and strategy hidden. Marked as differing
# (TensorBoard computes `differs` only for an experiment it infers from the runs),
# these lead the table.
LEAD = ("policy", "loop", "model", "strategy")


def _experiment(hparams: dict[str, Any]):
  """hp.hparams_config's summary, with the LEAD hparams marked `differs`."""
  from tensorboard.plugins.hparams import plugin_data_pb2
  pb = hp.hparams_config_pb(hparams=declared(hparams),
                            metrics=[hp.Metric(m) for m in METRICS])
  value = pb.value[0]
  data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
  for info in data.experiment.hparam_infos:
    info.differs = info.name in LEAD
  value.metadata.plugin_data.content = data.SerializeToString()
  return pb
