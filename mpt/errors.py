"""The one exception type for bad user input.

Anything the user can fix (an unknown policy, a missing data folder, an unwritable logs
root) raises `UserError`; `mpt.main` turns it into a single `mpt: error: ...` line on
stderr and exit status 2. Everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
  """Bad input: reported as one line, never as a traceback."""
