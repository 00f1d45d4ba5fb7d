"""Short Keras training programs in the shapes of keras.io's guides and examples, each
measured by `mpt.callbacks` or `mpt.track` (run by run_all.py, tested by
tests/train/script/test_programs.py)."""
