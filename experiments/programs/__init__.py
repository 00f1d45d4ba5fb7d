"""Keras training programs in shapes the test corpus (tests/train/script/programs) does
not hold, sized to train for real on a CPU: a distiller whose loss runs a frozen
teacher, a classifier trained whole then on its frozen encoder, a custom Loss
subclass, and a small search that fits several models in one process. Each has
`main(run_dir)` and writes one or more mpt run folders under `run_dir`; run by
experiments/program_cost.py."""
