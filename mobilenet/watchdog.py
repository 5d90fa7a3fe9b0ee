"""The stall watchdog (train.stall_timeout): a process without progress (a step, a validation
batch, a save) that long ends, exit 1, in one line naming what it waits for (a rank, or a loader
worker and its open file); it also ends the process at a second Ctrl-C, wherever it is blocked.
torch's own timeouts name no culprit, so daemon threads publish each rank's progress through
torch.distributed's store and read the signal wake-up pipe, which C writes at once."""
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

from mobilenet.distributed import TORCH_WAIT_S
from mobilenet.errors import ERROR_DIR, EXIT_FAILURE, STOPPED, report

PUBLISH_EVERY_S = 2.0  # a rank says it is alive this often
POLL_S = 0.1           # and publishes new progress within this
STORE_ANSWER_S = 5.0   # how long the stalled process waits for the store before it says so
PAUSE_S = 1.0          # the checking thread waking this late means the process was stopped, not stalled
KEY = "mobilenet/progress/{}"
VERDICT = "mobilenet/stalled/{}"  # what a rank that ended on a stall found: the others say the same


class Watchdog:
    """``beat(step)`` after each unit of progress; ``waiting_for``: "data", "val-data" or "save".
    Off at ``timeout`` 0; timed from the first beat. A paused process (SIGSTOP, Slurm's suspend)
    is not a stalled one: its thread wakes late and starts the timer again. The threads never raise."""

    def __init__(self, timeout, world, data_path, checkpoints):
        self.timeout, self.world = timeout, world
        self.data_path, self.checkpoints = data_path, checkpoints
        self.step, self.last, self.waiting_for, self.wait_start = 0, None, None, time.monotonic()
        self.timer_from = None  # monotonic time the stall timer starts again from (a pause, a peer's progress)
        self.saving = None      # the file being written, while waiting for "save"
        self.stopped = threading.Event()

    @property
    def collective_wait(self):
        """A collective's timeout in s: twice this one and a minute (this names the culprit first), or torch's."""
        return 2 * self.timeout + 60 if self.timeout > 0 else TORCH_WAIT_S

    def __enter__(self):
        self.wakeup_read, write = os.pipe()
        os.set_blocking(write, False)
        self.previous_wakeup = signal.set_wakeup_fd(write)
        threading.Thread(target=end_on_second_interrupt, args=(self.wakeup_read, self.stopped), name="second-signal",
                         daemon=True).start()
        if self.timeout > 0:
            threading.Thread(target=self.check, name="stall-watchdog", daemon=True).start()
            if self.world.size > 1:
                threading.Thread(target=self.publish, name="stall-progress", daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        os.close(signal.set_wakeup_fd(self.previous_wakeup))

    @contextlib.contextmanager
    def waiting(self, what):
        """The process waits for ``what`` ('data': a training batch, 'val-data') within the block."""
        self.waiting_for, self.wait_start = what, time.monotonic()
        try:
            yield
        finally:
            self.waiting_for = None

    @contextlib.contextmanager
    def writing(self, path):
        """The block writes ``path`` (it waits for 'save'); its end is progress."""
        self.saving = path
        with self.waiting("save"):
            yield
        self.beat()

    def wait_seconds(self):
        return time.monotonic() - self.wait_start

    def beat(self, step=None):
        if step is not None:
            self.step = step
        self.last = time.monotonic()

    def publish(self):
        """This rank's progress within POLL_S of a beat, and that it is alive every PUBLISH_EVERY_S."""
        store, published, said = default_store(), None, 0.0
        while store is not None and not self.stopped.wait(POLL_S):
            last = self.last
            if last is None or (last == published and time.monotonic() - said < PUBLISH_EVERY_S):
                continue
            now = time.time()
            progress_at = now - (time.monotonic() - last)
            try:
                store.set(KEY.format(self.world.rank), f"{self.step} {progress_at} {now} {self.waiting_for or '-'}")
                published, said = last, time.monotonic()
            except Exception:  # noqa: BLE001  a store that fails once must not end the reports
                pass

    def check(self):
        interval = min(1.0, self.timeout / 10)
        woke = time.monotonic()
        while not self.stopped.wait(interval):
            now = time.monotonic()
            if now - woke > interval + PAUSE_S:  # this thread was stopped with the process
                self.timer_from = now
            woke = now
            if self.stalled(now):
                self.fire()

    def stalled(self, now):
        return self.last is not None and now - self.quiet_since() > self.timeout

    def quiet_since(self):
        """When the stall timer started: the last beat, or a later restart (a pause, a peer's progress)."""
        return max(self.last, self.timer_from or self.last)

    def fire(self):
        """Ends the process with the line that says what it waits for, unless a peer makes progress."""
        try:
            cause = self.cause()
        except Exception as e:  # noqa: BLE001  never a thread's traceback; the line still goes out
            cause = f"what it waits for could not be told ({type(e).__name__}: {e})"
        if cause is None:
            self.timer_from = time.monotonic()
            return
        if self.world.size > 1:  # the ranks that fire after it say the same, not that it is gone
            with_store(lambda store: store.set(VERDICT.format(self.world.rank), cause))
        waited = time.monotonic() - self.quiet_since()
        line = (f"error: rank {self.world.rank} made no progress for {waited:.0f} s "
                f"(train.stall_timeout {self.timeout:g}) after global step {self.step}: {cause}; the job "
                f"stops, the checkpoints in {self.checkpoints} stay valid (resume with --resume auto)")
        end_process(line, EXIT_FAILURE)

    def cause(self):
        """What this process waits for; None when that is a peer that makes progress."""
        if self.waiting_for == "save":
            return (f"it is writing {self.saving} and the write does not return (a hung or very slow "
                    f"file system?)")
        if self.waiting_for in ("data", "val-data"):
            return "it waits for a batch from the data loader; " + describe_workers(self.data_path)
        if self.world.size == 1:
            return "the training step itself does not return (the device, or a hung collective)"
        return peer_cause(self.world, self.step, self.timeout)


def end_on_second_interrupt(wakeup_read, stopped):
    """A second SIGINT (not within 1 s of the first) ends the process now. Not SIGTERM: Slurm and
    torchrun often deliver one request twice, and the run must still save."""
    first = None
    while True:
        try:
            numbers = os.read(wakeup_read, 64)
        except OSError:
            return
        if not numbers:  # __exit__ closed the write end
            os.close(wakeup_read)
            return
        for number in numbers:
            if number == signal.SIGINT and not stopped.is_set():
                if first is None or time.monotonic() - first < 1.0:  # one delivery, doubled
                    first = first or time.monotonic()
                else:
                    name = signal.Signals(number).name
                    end_process(STOPPED.format(name=name), 128 + number,
                                echo=not os.environ.get(ERROR_DIR))


def peer_cause(world, step, timeout):
    """What a stalled rank of several waits for; None when a peer makes progress."""
    verdict = read_verdict(world.size)
    if verdict:
        return verdict
    before, before_at = read_progress(world.size), time.time()
    if before is None:
        return (f"the job's store does not answer within {STORE_ANSWER_S:g} s, so rank 0 (or the "
                f"launcher that hosts it) is stopped or gone")
    time.sleep(2.5 * PUBLISH_EVERY_S)  # a live rank says so again meanwhile; a stopped one cannot
    after, verdict = read_progress(world.size), read_verdict(world.size)
    if verdict:  # another rank waited as long and ended meanwhile: not a culprit
        return verdict
    now, others = time.time(), [rank for rank in range(world.size) if rank != world.rank]
    progress = after if after is not None else before  # the store's host ended meanwhile (its own stall)

    def silent(rank):  # two reports tell without comparing clocks (nodes' clocks differ)
        if rank not in progress:
            return True
        if after is not None and rank in before:
            return progress[rank][2] == before[rank][2]
        return before_at - progress[rank][2] > 2.5 * PUBLISH_EVERY_S  # as it stood at the first read
    stopped = [rank for rank in others if silent(rank)]
    # a live peer whose last progress is recent by its own clock: the job goes on, this rank waits for it
    if any(progress[rank][2] - progress[rank][1] < timeout for rank in others if rank not in stopped):
        return None
    if stopped:  # the ranks keep in step (a collective every step): it stopped within one of this one's
        return "; ".join(f"rank {rank} " + (f"has not answered for {now - progress[rank][2]:.0f} s (stopped or "
                                            f"gone) at global step {step} or the one before (its last "
                                            f"report: global step {progress[rank][0]})"
                                            if rank in progress else
                                            "has reported no progress (stopped or gone before its first report)")
                         for rank in stopped) + "; the others wait for it"
    waiting_for_data = [rank for rank in others if progress[rank][3] in ("data", "val-data")]
    if waiting_for_data:
        return (f"rank(s) {', '.join(map(str, waiting_for_data))} make no progress and wait for their "
                f"data loader (a loader worker is stuck there); the others wait for them")
    return "every rank is alive and makes no progress (a hung collective?)"


def default_store():
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.distributed_c10d._get_default_store()


def with_store(action):
    """``action(store)`` in a thread (a stopped host blocks it), or None after STORE_ANSWER_S."""
    store, box = default_store(), []

    def call():
        try:
            box.append(action(store))
        except Exception:  # noqa: BLE001  a store torn down or gone: no answer
            pass
    if store is None:
        return None
    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(STORE_ANSWER_S)
    return box[0] if box else None


def read_progress(size):
    """{rank: (step, made at, alive at, waiting for)} as published, or None: no answer."""
    def read(store):
        found = {}
        for rank in range(size):
            if store.check([KEY.format(rank)]):
                step, progress_at, alive_at, waiting_for = store.get(KEY.format(rank)).decode().split()
                found[rank] = (int(step), float(progress_at), float(alive_at), waiting_for)
        return found
    return with_store(read)


def read_verdict(size):
    """What a rank that ended on this stall already found, saying which rank; or None."""
    def read(store):
        for rank in range(size):
            if store.check([VERDICT.format(rank)]):
                return f"{store.get(VERDICT.format(rank)).decode()} (as rank {rank} found, which ended first)"
        return None
    return with_store(read)


def describe_workers(data_path):
    """The loader workers that do not run and the data files they have open, from /proc."""
    states = {"T": "stopped", "t": "stopped", "D": "waiting on the disk", "Z": "dead"}
    found = []
    for child in multiprocessing.active_children():
        state = proc_state(child.pid)
        files = open_files(child.pid, data_path)
        if state in states or files:
            what = f"loader worker pid {child.pid} is {states.get(state, 'running')}"
            found.append(what + (f", reading {files[0]}" if files else ""))
    return "; ".join(found) if found else "no loader worker is stopped (a slow file system?)"


def proc_state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def open_files(pid, data_path):
    """The files under ``data_path`` that process ``pid`` has open."""
    root = os.path.realpath(str(data_path)) if data_path else None
    files = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if root and target.startswith(root + os.sep):
                files.append(target)
    except OSError:
        pass
    return files


def kill_loader_workers():
    """SIGKILL to the loader workers (a stopped one ignores SIGTERM), torch's SIGCHLD handler off."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in multiprocessing.active_children():
        try:
            os.kill(child.pid, signal.SIGKILL)
        except OSError:
            pass


def end_process(line, code, echo=True):
    """Says ``line`` (for the launcher too), then ends the process and its workers at once."""
    report(line, code, echo=echo)
    kill_loader_workers()
    os._exit(code)
