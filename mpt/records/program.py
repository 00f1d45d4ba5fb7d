"""What a user's program ran, as mpt.callbacks or mpt.track saw it: summary.json's
`program` (a run of the command line has flags.txt instead, a flagfile that replays
it; a script's run cannot be replayed by mpt, so its record is not dressed as one).

Written by mpt/train/script/library.py; read by the diagnosis (the optimizers' loss scales and
whether each scaled its loss) and by anyone reading the run folder.
"""

import dataclasses

from mpt.records.cost import Cost


@dataclasses.dataclass
class OptimizerRecord:
  """One optimizer of the program, over the whole run."""
  name: str = ""
  cls: str = ""  # Its class; a LossScaleOptimizer's inner one in `inner`.
  inner: str | None = None
  learning_rate: float | None = None
  loss_scale: float | None = None  # Dynamic or fixed; None without loss scaling.
  # Updates skipped for non-finite gradients: steps run while it was in use minus its
  # updates (a LossScaleOptimizer does not count a skipped one), exact for one update
  # per step; None for an optimizer that cannot skip.
  skipped_steps: int | None = None
  updates: int = 0  # Its iterations' growth over the run.
  # Whether the program called its scale_loss() (None: not seen either way, e.g. the
  # step was traced before mpt watched it).
  scale_loss_called: bool | None = None
  apply_called: bool | None = None


@dataclasses.dataclass
class Fit:
  """One `fit` (or the loop): the epochs and steps it was asked for and ran."""
  epochs: int | None = None  # Asked for (fit's `epochs`); None for a loop.
  steps_per_epoch: int | None = None  # Keras' count, None where the data has no length.
  steps: int = 0  # Run.
  epochs_completed: int = 0
  # Its step timed per policy at its warm-up's end (mpt/train/before_step1/scriptcost.py;
  # the run's `cost` is its last fit's), and the median of its own timed steps.
  cost: Cost | None = None
  ms_per_step: float | None = None


@dataclasses.dataclass
class Program:
  """The program's run: which entry point, its fits, batch, policy, optimizers and
  inputs (per-example shapes by input name: as fed where mpt saw a batch, else as
  the model declares them)."""
  api: str = "mpt.callbacks"  # Or "mpt.track".
  policy: str | None = None
  batch_size: int | None = None  # The batch fed (its first).
  batch_size_given: int | None = None  # What mpt was told, where it differed.
  fits: list[Fit] = dataclasses.field(default_factory=list)
  optimizers: list[OptimizerRecord] = dataclasses.field(default_factory=list)
  inputs: dict[str, list] = dataclasses.field(default_factory=dict)
  models: list[str] = dataclasses.field(default_factory=list)

  def stepped(self) -> list[OptimizerRecord]:
    """The optimizers that updated anything (a default one compile() made and a custom
    train_step never used is left out)."""
    return [o for o in self.optimizers if o.updates or o.apply_called]
