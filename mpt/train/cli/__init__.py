"""Room: the command line's run (`python -m mpt.main --mode=train|inspect`). Imports
common/ and before_step1/, never script/.

run.py         `train_and_evaluate(cfg)`: prepare, loop, close, as one reads it
prepare.py     `prepare(cfg)` -> `Run`: checks, strategy, data, the model, a resume
dryrun.py      --mode=inspect: the model built, its dtypes, memory and plans, no step
callbacks.py   the run's callbacks in order around one step counter
loops.py       the two training paths (Keras fit, mpt's own tf.function loop)
data.py        one tf.data pipeline for both loops; synthetic.py its default images
distribute.py  the tf.distribute strategy, and which process writes
checkpoint.py  checkpoints, --resume, the event files pruned to the resumed step
guards.py      divergence, signals, injected faults
record.py      summary.json of a command-line run (figures from common/figures.py)
"""
