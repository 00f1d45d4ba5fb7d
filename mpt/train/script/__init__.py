"""Room: a user's own program. `mpt.callbacks(...)` and `mpt.track(...)` import only
this room, common/ and, after the first step, before_step1/scriptcost.py: never the
command line's machinery (cli/).

library.py  the callbacks around a user's `model.fit` (any model, several fits),
            and the run's state they share (RunFolder: it opens and closes the run)
inspect.py  the first step's dtype report, trained parameters and step FLOPs
costing.py  each fit's step cost, loading stepcost.py only when it runs
tracker.py  `mpt.track`: a user's own loop, its step and batches
watch.py    a script's optimizers: updates, skipped steps, scale_loss() seen
stepcost.py the program's step timed per policy after each fit's warm-up
"""
