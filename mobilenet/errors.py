"""The app's two kinds of expected failure and how a command line reports them.

UsageError: the user's input is wrong (a flag, a setting, a file or folder they named); fixing the
input fixes the run. TrainingFailure: the run cannot go on (the loss diverged, the disk is full);
what was saved before stays valid. Both print as one ``error: ...`` line and exit with code 2;
anything else is a bug and keeps its traceback.
"""
import sys

EXIT_ERROR = 2


class UsageError(Exception):
    """A problem with the user's input: reported in one line, no traceback."""


class TrainingFailure(Exception):
    """The run had to stop (not the input's fault): reported in one line, no traceback."""


def exit_code(action):
    """Runs ``action()``: 0, or 2 after printing a UsageError/TrainingFailure as one line."""
    try:
        action()
        return 0
    except (UsageError, TrainingFailure) as e:
        print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
        return EXIT_ERROR


def one_line(error):
    """The message's last line: raised in a DataLoader worker, it carries the worker's traceback."""
    last = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    for prefix in ("mobilenet.errors.UsageError: ", "mobilenet.errors.TrainingFailure: "):
        last = last.removeprefix(prefix)
    return last
