"""Distribution: which tf.distribute strategy a run uses, and which process writes.

`--strategy` picks TensorFlow's own engine, never a home-made one:
  default       one device (TensorFlow's default strategy: the first GPU, or the CPU);
  mirrored      MirroredStrategy over this machine's GPUs, or over N logical CPU
                devices with `--cpu_devices=N` (how a CPU-only machine runs it);
  multi_worker  MultiWorkerMirroredStrategy over the processes that `TF_CONFIG` lists
                (one per machine, or several on one machine on different ports);
  tpu           TPUStrategy (documented, untested: no TPU was available to mpt).

`--batch_size` is the global batch: every step takes one batch of that size and splits
it across the replicas, so a run's curve does not depend on the replica count. The
model, optimizer and metrics are created under the strategy's scope
(mpt/train/cli/prepare.py).

Only the chief (`chief` in TF_CONFIG, else worker 0) writes the run folder. The other
workers still run every step, including checkpoint saves (a save reads synchronised
variables, which is a collective every worker must join), but into a scratch folder
that is deleted when they finish.

Devices and collectives can only be set up before TensorFlow's runtime starts, so
`setup` runs first in a training run, before any op.
"""

import dataclasses
import json
import os
from typing import Any

import tensorflow as tf

from mpt.config import Config
from mpt.errors import UserError

TF_CONFIG_HELP = ('TF_CONFIG=\'{"cluster": {"worker": ["host1:port", "host2:port"]}, '
                  '"task": {"type": "worker", "index": 0}}\'')


@dataclasses.dataclass
class Setup:
  """The strategy of a run and this process's place in it."""
  strategy: tf.distribute.Strategy
  name: str  # the --strategy value
  replicas: int  # replicas in sync, over all workers
  workers: int
  task: str  # "worker:0"; "local" outside a cluster
  is_chief: bool
  devices: list[str]  # this process's replica devices

  def describe(self) -> str:
    where = f", task {self.task} of {self.workers} workers" if self.workers > 1 or \
        self.name == "multi_worker" else ""
    return (f"strategy {self.name}: {self.replicas} replica(s) on "
            f"{', '.join(self.devices)}{where}")

  def summary(self, batch_size: int) -> dict[str, Any]:
    return {"strategy": self.name, "replicas": self.replicas, "workers": self.workers,
            "task": self.task, "devices": self.devices,
            "per_replica_batch": batch_size // self.replicas}


def parse_tf_config(text: str) -> tuple[dict[str, list[str]], str, int]:
  """TF_CONFIG -> (cluster, task type, task index); UserError saying what is wrong."""
  try:
    spec = json.loads(text)
  except json.JSONDecodeError as e:
    raise UserError(f"TF_CONFIG is not JSON ({e}); expected {TF_CONFIG_HELP}") from None
  if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict):
    raise UserError(f"TF_CONFIG has no \"cluster\" object; expected {TF_CONFIG_HELP}")
  cluster, task = spec["cluster"], spec.get("task")
  for job, addresses in cluster.items():
    if job not in ("chief", "worker", "evaluator", "ps"):
      raise UserError(f"TF_CONFIG cluster has an unknown job {job!r}; "
                      "multi_worker uses chief and worker")
    if not isinstance(addresses, list) or not addresses:
      raise UserError(f"TF_CONFIG cluster job {job!r} must be a non-empty list of "
                      "host:port addresses")
    for address in addresses:
      host, _, port = str(address).rpartition(":")
      if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"TF_CONFIG cluster job {job!r} has a bad address "
                        f"{address!r}; expected host:port")
  if "ps" in cluster or "evaluator" in cluster:
    raise UserError("TF_CONFIG lists ps/evaluator jobs; multi_worker (synchronous "
                    "all-reduce) uses only chief and worker")
  if "worker" not in cluster and "chief" not in cluster:
    raise UserError(f"TF_CONFIG cluster lists no workers; expected {TF_CONFIG_HELP}")
  if not isinstance(task, dict) or "type" not in task or "index" not in task:
    raise UserError("TF_CONFIG has no \"task\": {\"type\": ..., \"index\": ...} "
                    "saying which worker this process is")
  kind, index = task["type"], task["index"]
  if kind not in cluster:
    raise UserError(f"TF_CONFIG task type {kind!r} is not a job of the cluster "
                    f"({', '.join(cluster)})")
  if not isinstance(index, int) or not 0 <= index < len(cluster[kind]):
    raise UserError(f"TF_CONFIG task index {index!r} is out of range: job {kind!r} has "
                    f"{len(cluster[kind])} address(es)")
  return cluster, kind, index


def is_chief(cluster: dict[str, list[str]], kind: str, index: int) -> bool:
  return kind == "chief" or (kind == "worker" and index == 0 and "chief" not in cluster)


def configure_cpu_devices(n: int) -> None:
  """Splits the CPU into `n` logical devices (0: as it is) before TensorFlow's runtime
  starts; a process started already (a test session, a notebook) is accepted if it was
  split the same way."""
  if not n:
    return
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
  except RuntimeError:  # The runtime is up: its devices are fixed.
    have = len(tf.config.list_logical_devices("CPU"))
    if have != n:
      raise UserError(f"--cpu_devices={n}: TensorFlow already started in this process "
                      f"with {have} logical CPU device(s); set it before the first "
                      "TensorFlow op (run mpt in a fresh process)") from None


def _mirrored_devices(cfg: Config) -> list[str]:
  gpus = tf.config.list_logical_devices("GPU") if not cfg.cpu_devices else []
  return [d.name for d in gpus or tf.config.list_logical_devices("CPU")]


def setup(cfg: Config) -> Setup:
  """Creates the strategy `cfg.strategy` names; UserError before any training."""
  if cfg.strategy == "multi_worker":
    if "TF_CONFIG" not in os.environ:
      raise UserError("--strategy=multi_worker reads the cluster from the TF_CONFIG "
                      f"environment variable, which is not set; e.g. {TF_CONFIG_HELP}")
    cluster, kind, index = parse_tf_config(os.environ["TF_CONFIG"])
    if cfg.cpu_devices > 1:
      raise UserError("--cpu_devices applies to --strategy=mirrored; multi_worker runs "
                      "one replica per worker on a CPU (start more workers instead)")
  configure_cpu_devices(cfg.cpu_devices)
  if cfg.strategy == "default":
    strategy = tf.distribute.get_strategy()
    device = (tf.config.list_logical_devices("GPU") or
              tf.config.list_logical_devices("CPU"))[0].name
    return Setup(strategy, "default", 1, 1, "local", True, [device])
  if cfg.strategy == "mirrored":
    devices = _mirrored_devices(cfg)
    # On logical CPUs, reduce through the first device rather than with collective
    # ops: they share one memory anyway, and collective instances are keyed per
    # process, so a second MirroredStrategy in one process (tests, a notebook)
    # would clash with the first's. GPUs keep TensorFlow's choice (NCCL).
    on_cpu = all("CPU" in d for d in devices)
    strategy = tf.distribute.MirroredStrategy(
        devices=devices,
        cross_device_ops=tf.distribute.ReductionToOneDevice() if on_cpu else None)
    return Setup(strategy, "mirrored", strategy.num_replicas_in_sync, 1, "local", True,
                 devices)
  if cfg.strategy == "multi_worker":
    # A worker that stops answering (hung, stopped, partitioned) must not hold the
    # others at the next collective forever: past the timeout the collective fails
    # with DeadlineExceededError and the run stops as interrupted (mpt/train/cli/run.py).
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=cfg.collective_timeout or None)
    try:
      strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except RuntimeError as e:  # e.g. "Collective ops must be configured at startup"
      raise UserError(f"--strategy=multi_worker could not start: {e}; start mpt in a "
                      "fresh process") from None
    workers = sum(len(cluster.get(job, [])) for job in ("chief", "worker"))
    return Setup(strategy, "multi_worker", strategy.num_replicas_in_sync, workers,
                 f"{kind}:{index}", is_chief(cluster, kind, index),
                 list(strategy.extended.worker_devices))
  # tpu: untested, no TPU was available; TPUClusterResolver finds a Cloud TPU or a
  # TPU VM's local chips.
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
  except (ValueError, RuntimeError, tf.errors.OpError) as e:
    raise UserError(f"--strategy=tpu found no TPU ({str(e).splitlines()[0]})") from None
  strategy = tf.distribute.TPUStrategy(resolver)
  return Setup(strategy, "tpu", strategy.num_replicas_in_sync, 1, "local", True,
               list(strategy.extended.worker_devices))


def check_batch(cfg: Config, dist: Setup) -> None:
  """The global batch must split evenly: every replica takes the same share."""
  if cfg.batch_size % dist.replicas:
    lower = cfg.batch_size - cfg.batch_size % dist.replicas
    raise UserError(f"--batch_size={cfg.batch_size} (the global batch) does not split "
                    f"evenly across {dist.replicas} replicas; use a multiple of "
                    f"{dist.replicas}, e.g. {lower or dist.replicas} or "
                    f"{lower + dist.replicas}")

