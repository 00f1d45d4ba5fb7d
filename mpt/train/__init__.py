"""Wing: one training run, in four rooms by concern, each importing only the rooms
below it (tests/test_architecture.py checks it):

  common/        what every run is made of, whoever drives it (bottom)
  before_step1/  before the first step: measure, then choose
  cli/           the command line's run: `--mode=train` and `--mode=inspect` (top)
  script/        a user's own program: `mpt.callbacks`, `mpt.track` (top; never cli/)

A default run, top to bottom: cli/run.py `train_and_evaluate` -> cli/prepare.py
(checks, strategy, data) -> before_step1/measure.py (the oneDNN rewrite, the step's
cost per policy, --policy=auto's choice: one `BeforeStep1`) -> cli/prepare.py (the
folder, the model and optimizer, the verdict, the dtype report and memory, a resume)
-> cli/callbacks.py and cli/loops.py (the steps) -> cli/record.py (summary.json) ->
common/ending.py (the one end: the record written, runs.csv, the diagnosis). A
script's run is script/library.py's callbacks around the user's fit, or
script/tracker.py around the user's loop, ending in the same common/ending.py.
Imports the ground floor (config, records, machine, measure, models), never another
wing.
"""
