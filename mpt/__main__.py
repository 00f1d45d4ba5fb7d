"""`python -m mpt`: the command line of mpt/main.py (`python -m mpt.main` works too)."""

from mpt import main

if __name__ == "__main__":
  main.run()
