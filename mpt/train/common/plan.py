"""A run's flags resolved once: `Plan.of(cfg)`.

A `Plan` is the run's Config (every flag keeps its field: flags.txt, the records and
the children read the strings as given) with what its string flags say, parsed and
checked once at the door: --layer_policy's (pattern, policy) pairs with the run's
16-bit and loss-scaling answers, --model_opts as the builder's typed options, and
--profile_steps' and --fault_steps' windows. Everything after validation takes the
Plan and reads these; nothing downstream parses a flag string again.
`dataclasses.replace(plan, policy=...)` (--policy=auto's choice, the cost's
candidates) resolves the new plan the same way.
"""

import dataclasses
from typing import Any

from mpt import config
from mpt import flagvalues
from mpt import models
from mpt.measure import profiler


@dataclasses.dataclass
class Plan(config.Config):
  """One run's Config, its string flags resolved (see the module docstring)."""
  # --layer_policy: (pattern, policy) in order; the first pattern matching a layer wins.
  layers: tuple[tuple[str, str], ...] = dataclasses.field(init=False, default=())
  opts: dict[str, Any] = dataclasses.field(init=False, default_factory=dict)
  # --profile_steps as written: (first, last), None ("off", or nothing asked), or ""
  # (TF's default window on a GPU); profiler.window checks it against the run.
  profile: Any = dataclasses.field(init=False, default=None)
  faults: tuple[int, int] | None = dataclasses.field(init=False, default=None)

  def __post_init__(self):
    config.validate(self)
    self.layers = tuple(config.layer_policies(self.layer_policy))
    self.opts = models.parse_opts(self.model, self.model_opts)  # Checks the name too.
    self.profile = "" if self.profile_steps == "" else (
        None if self.profile_steps == "off"
        else flagvalues.parse_steps(self.profile_steps, "profile_steps"))
    self.faults = flagvalues.parse_steps(self.fault_steps, "fault_steps")
    profiler.window(self.profile, self.warmup_steps, 10**12)  # After the warm-up.

  @classmethod
  def of(cls, cfg: config.Config) -> "Plan":
    """`cfg` resolved (a Plan already is); UserError naming the flag that is wrong."""
    if isinstance(cfg, cls):
      return cfg
    return cls(**{f.name: getattr(cfg, f.name) for f in config.fields()})

  @property
  def policies(self) -> tuple[str, ...]:
    """The run's policy, then those --layer_policy gives layers."""
    return (self.policy, *(p for _, p in self.layers))

  @property
  def sixteen(self) -> str | None:
    """The 16-bit policy the run computes in (config.sixteen_bit's rule), or None."""
    return config.sixteen_bit(self.policy, self.layers)

  @property
  def scales_loss(self) -> bool:
    """Whether some layer computes in float16: the run's loss is then scaled."""
    return config.scales(*self.policies)
