"""mpt: measure whether mixed precision makes a TensorFlow/Keras model train faster.

See README.md for the quick start and mpt/main.py for the command line.
"""

__version__ = "0.1.0"
