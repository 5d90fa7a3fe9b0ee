"""The app's kinds of failure and their exit codes, each one line: UsageError (exit 2),
TrainingFailure (exit 1, what was saved stays valid), a bug (exit 1, the line names its traceback's
file), a signal with nothing to save (128 + its number)."""
import contextlib
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path

EXIT_USAGE, EXIT_FAILURE = 2, 1
# Set by mobilenet.launch: each worker leaves its exit code and line there, for the launcher's last line.
ERROR_DIR = "MOBILENET_ERROR_DIR"
STOPPED = "{name}: stopped, nothing saved now (checkpoints written before stay valid)"
# The signals that stop a run (a closed terminal sends SIGHUP; torchrun forwards all three).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Files being written through a temporary name (save_atomic), which an ending at once removes.
TEMPORARIES = set()


class UsageError(Exception):
    """A problem with the user's input: reported in one line, no traceback."""


class TrainingFailure(Exception):
    """The run had to stop (not the input's fault): reported in one line, no traceback."""


def exit_at_once(signum, frame):
    """A stop signal before the run handles them: nothing to save, the process ends now."""
    name = signal.Signals(signum).name
    for path in list(TEMPORARIES):
        with contextlib.suppress(OSError):
            os.unlink(path)
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(report(STOPPED.format(name=name), 128 + signum, echo=not os.environ.get(ERROR_DIR)))


def stop_signals():
    """STOP_SIGNALS, less a SIGHUP this process started with ignored (nohup)."""
    return [s for s in STOP_SIGNALS if not (s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN)]


def exit_code(action, run_dir=lambda: None, ending=False):
    """``action()``'s exit code, any failure reported in one line; ``run_dir()``: where a bug's
    traceback goes. ``ending``: a late stop signal is then ignored (143 must not replace a saved
    run's 0)."""
    previous = {s: signal.signal(s, exit_at_once) for s in stop_signals()}
    try:
        action()
        return report("", 0)
    except UsageError as e:  # under the launcher, the launcher says it, once for the job
        return report(f"error: {one_line(e)}", EXIT_USAGE, echo=not os.environ.get(ERROR_DIR))
    except TrainingFailure as e:
        return report(f"error: {one_line(e)}", EXIT_FAILURE)
    except KeyboardInterrupt:  # raised by code the action runs (a stop signal here is exit_at_once's)
        return report(STOPPED.format(name="SIGINT"), 128 + signal.SIGINT, echo=not os.environ.get(ERROR_DIR))
    except Exception as e:  # noqa: BLE001
        if peer_left(e):
            return report(f"error: rank {os.environ.get('RANK', '0')}: another process of the job ended while "
                          f"this one waited for it ({one_line(e)[:200]}); this rank stops, nothing saved now "
                          f"(the checkpoints written before stay valid: resume with --resume auto)", EXIT_FAILURE)
        # a bug: the user gets one line, the traceback a file
        path = save_traceback(run_dir())
        return report(f"error: unexpected {type(e).__name__}: {one_line(e)[:300]} (a bug, or a failure "
                      f"the app does not handle; traceback in {path})", EXIT_FAILURE)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if ending else handler)


# What torch.distributed's backends say when the process at the other end of a connection is gone.
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Connection refused",
             "remote process exited", "Socket Timeout", "failed to recv, got 0 bytes")


def peer_left(error):
    """Whether ``error`` is a collective or store failing because another process ended."""
    if int(os.environ.get("WORLD_SIZE", 1)) < 2:
        return False
    distributed = type(error).__module__.startswith("torch.distributed") or "Dist" in type(error).__name__
    return (distributed or isinstance(error, RuntimeError)) and any(text in str(error) for text in PEER_GONE)


def report(line, code, echo=True):
    """Prints ``line`` (with ``echo``) and, under the launcher, leaves it and ``code`` for it."""
    try:
        if line and echo:
            print(line, file=sys.stderr, flush=True)
    except OSError:  # the terminal is gone; the code still tells
        pass
    folder = os.environ.get(ERROR_DIR)
    if folder:
        rank = os.environ.get("RANK", "0")
        with contextlib.suppress(OSError):
            Path(folder, f"rank{int(rank):05d}").write_text(f"{code}\n{line}\n")
    return code


def mark_started():
    """Under the launcher: this worker's job has begun (so a lost rendezvous is a node that left)."""
    folder = os.environ.get(ERROR_DIR)
    if folder:
        with contextlib.suppress(OSError):
            Path(folder, f"started-rank{int(os.environ.get('RANK', '0')):05d}").touch()


def save_traceback(folder):
    """The exception's traceback in ``folder``/traceback-rankR.txt (else a temporary file); its path."""
    name = f"traceback-rank{os.environ.get('RANK', '0')}.txt"
    places = [Path(folder) / name] if folder else []
    places.append(Path(tempfile.gettempdir()) / f"mobilenet-{os.getpid()}-{name}")
    for path in places:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(traceback.format_exc())
            return path
        except OSError:
            continue
    return "nowhere (no writable folder)"


def one_line(error):
    """The message's last line: raised in a DataLoader worker, it carries the worker's traceback."""
    last = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    for prefix in ("mobilenet.errors.UsageError: ", "mobilenet.errors.TrainingFailure: "):
        last = last.removeprefix(prefix)
    return last
