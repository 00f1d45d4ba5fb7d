"""Where each detector says what it is, beside its rule: `@detector(name, needs=...,
superseded_by=...)`. Registering in the rule's own module keeps a new detector to
three files (its module; its cut-off in mpt/diagnose/thresholds.py; its row in
docs/diagnosis.md, whose words tests/diagnose/test_diagnose.py `DOC_WORDS` checks),
and a test.

The diagnosis lists its checks in registration order: the order
mpt/diagnose/detectors/__init__.py imports the modules in, then each module's own.
"""

from typing import Callable

# name -> the rule: a pure function of the run's Evidence, returning a Finding or None.
DETECTORS: dict[str, Callable] = {}
# name -> the detectors whose finding explains what this one would say (it then
# does not run).
SUPERSEDED_BY: dict[str, tuple[str, ...]] = {}
# name -> the evidence it needs that a run may lack (mpt/diagnose/detectors: HAS).
NEEDS: dict[str, str] = {}


def detector(name: str, needs: str | None = None,
             superseded_by: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
  """Registers the decorated rule as the detector `name`."""
  def register(rule: Callable) -> Callable:
    assert name not in DETECTORS, f"two detectors named {name}"
    DETECTORS[name] = rule
    if needs:
      NEEDS[name] = needs
    if superseded_by:
      SUPERSEDED_BY[name] = tuple(superseded_by)
    return rule
  return register
