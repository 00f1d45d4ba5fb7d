"""The step timer and counter under Keras' hooks as fit calls them, including
`steps_per_execution` > 1, where one pair of hooks covers several steps (begin and
end named by their first and last step): each is counted (docs/usage.md), no step
lost. Driven by the hooks directly: no training, no timed assertion."""

from mpt.measure import instrument


def _call(callbacks, begin, end):
  for c in callbacks:
    c.on_train_batch_begin(begin)
  for c in callbacks:
    c.on_train_batch_end(end)


def test_one_call_of_four_steps_counts_four_and_splits_its_time():
  timer, counter = instrument.StepTimer(warmup_steps=1), instrument.StepCounter(10)
  _call([timer, counter], 0, 3)  # steps_per_execution=4: hooks at steps 0 and 3.
  _call([timer, counter], 4, 7)
  assert timer.steps == 8 and counter.done == 18 and counter.current == 15
  first, second = timer.durations_ms[:4], timer.durations_ms[4:]
  assert len(set(first)) == 1 and len(set(second)) == 1  # An equal share each.
  assert timer.timed == [False] + [True] * 7  # warmup_steps=1: the first step.
  assert timer.waits_ms[1:4] == [0.0, 0.0, 0.0]  # The fetch is the call's first step's.


def test_a_step_per_call_and_hooks_without_numbers_count_one_each():
  timer, counter = instrument.StepTimer(warmup_steps=0), instrument.StepCounter(0)
  for step in range(3):
    _call([timer, counter], step, step)
  _call([timer, counter], None, None)  # A loop that gives no batch numbers.
  assert (timer.steps, counter.done) == (4, 4)
