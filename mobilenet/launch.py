"""train.sh's multi-process launch: torchrun's launcher in this process, the config checked once
before any worker starts, a failure's one line last, below torchrun's report.
python -m mobilenet.launch [torchrun flags] train.py [train.py flags]"""
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from mobilenet.errors import ERROR_DIR, EXIT_FAILURE, EXIT_USAGE, STOP_SIGNALS, STOPPED, exit_code


def main(argv=None):
    torchrun = import_torchrun()
    parser = torchrun.get_args_parser()
    parser.allow_abbrev = False  # as train.py: no flag is reached by a prefix of it
    args = parser.parse_args(argv)
    code = exit_code(lambda: check_config(args))  # once here, not once per worker
    if code:
        return code
    folder = tempfile.mkdtemp(prefix="mobilenet-errors-")
    os.environ[ERROR_DIR] = folder  # the workers inherit it
    try:
        return launch(torchrun, args, Path(folder))
    except KeyboardInterrupt:  # before torchrun's own handlers are in place
        print(STOPPED.format(name="SIGINT"), file=sys.stderr)
        return 128 + signal.SIGINT
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def import_torchrun():
    """torch.distributed.run, torch's C++ warnings off in this process (the rendezvous store's, as
    a node leaves, which the last line explains) unless TORCH_CPP_LOG_LEVEL is set; workers keep theirs."""
    user = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = user or "ERROR"
    try:
        from torch.distributed import run as torchrun
    finally:
        if user is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
    return torchrun


def check_config(args):
    """Resolves train.py's config as each worker will: a bad setting is one line before anything starts."""
    from mobilenet.cli import build_parser, config_from_args
    os.environ.update(LOCAL_WORLD_SIZE=str(args.nproc_per_node),
                      WORLD_SIZE=str(node_count(args) * int(args.nproc_per_node)))
    try:
        config_from_args(build_parser().parse_intermixed_args(args.training_script_args), probe=False)
    finally:
        for key in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
            del os.environ[key]


def launch(torchrun, args, errors):
    """torchrun's run(); on a failure its report, then the workers' own lines and the first one's code."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousTimeoutError
    several = node_count(args) > 1
    node = f"node {args.node_rank} of {str(args.nnodes).replace(':', ' to ')}" if several else "this node"
    if several:
        print(f"{node}: meeting the other nodes at {args.rdzv_endpoint} ({waits(args)})", flush=True)
    for name in QuietEnding.LOGGERS:
        logging.getLogger(name).addFilter(QuietEnding(errors))
    try:
        torchrun.run(args)
    except SignalException as e:  # torchrun passed it on and waited for the workers to end
        for stop in STOP_SIGNALS:  # a second one (Slurm and torchrun send two) must not cut the report
            signal.signal(stop, signal.SIG_IGN)
        return signalled(e.sigval.name, outcomes(errors), args)
    except ChildFailedError as e:
        ended = {rank: failure.signal_name() if failure.exitcode < 0 else failure.exitcode
                 for rank, failure in e.failures.items()}
        code, line = likely_cause(ended, outcomes(errors))
        if code != EXIT_USAGE:  # a refusal is its line alone: nothing failed
            print(e, file=sys.stderr)
        print(line, file=sys.stderr, flush=True)
        return code
    except RendezvousError as e:
        if finished_here(errors, args):  # the job ended; the rendezvous closed as another node left
            print(f"{node}: the job ended", flush=True)
            return 0
        if any(errors.glob("started-rank*")):  # the workers had run: a node left, not a set-up mistake
            print(f"error: {node}: the rendezvous at {args.rdzv_endpoint} was lost after the job had started "
                  f"(another node left, or the host serving it went away); the checkpoints written before "
                  f"stay valid: start train.sh again on every node with --resume auto", file=sys.stderr, flush=True)
            return EXIT_FAILURE
        if isinstance(e, RendezvousTimeoutError):
            what = f"the other nodes did not all arrive within {rendezvous_timeout(args)} s"
        else:
            what = f"the rendezvous failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'})"
        print(f"error: {node} at {args.rdzv_endpoint}: {what}; start train.sh on every node with the same "
              f"--nnodes, --master-addr, --master-port and --rdzv-id (and another job with other ones)",
              file=sys.stderr, flush=True)
        return EXIT_FAILURE
    except Exception as e:  # noqa: BLE001  torchrun's own failure at a job's edge, e.g. torch 2.14's launch_agent
        # on an agent whose rendezvous another job's node closed (it returns None: AttributeError)
        if finished_here(errors, args):
            print(f"{node}: the job ended", flush=True)
            return 0
        detail = str(e).splitlines()[0][:160] if str(e) else ""
        print(f"error: {node}: torchrun ended with {type(e).__name__} ({detail}) "
              f"before this node's workers finished; if another job meets at {args.rdzv_endpoint} with the same "
              f"--rdzv-id, give each job its own --master-port", file=sys.stderr, flush=True)
        return EXIT_FAILURE
    if several:
        print(f"{node}: the job ended", flush=True)
    return 0


class QuietEnding(logging.Filter):
    """Leaves out torchrun's logs of an ending the last line says better: the store's host leaving
    first (C++ tracebacks after every worker ended well), and the ends that follow a refusal (exit 2)."""
    ENDINGS = ("Error waiting on exit barrier", "has failed to shutdown the rendezvous")
    AFTER_REFUSAL = ("Sending process", "failed (exitcode")
    LOGGERS = ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
               "torch.distributed.elastic.multiprocessing.api")

    def __init__(self, errors):
        super().__init__()
        self.errors = errors

    def filter(self, record):
        text = str(record.msg)
        if any(ending in text for ending in self.ENDINGS):
            return False
        return not (any(part in text for part in self.AFTER_REFUSAL)
                    and any(code == EXIT_USAGE for code, _ in outcomes(self.errors).values()))


def finished_here(errors, args):
    """Whether every worker of this node ended well (the job is done here)."""
    ended = outcomes(errors)
    return len(ended) == int(args.nproc_per_node) and not any(code for code, _ in ended.values())


# The signals torchrun itself ends the other workers with once one has failed (SIGTERM, then SIGKILL
# after its grace period): a worker killed so without a word may be a consequence, not the cause.
LAUNCHER_SIGNALS = ("SIGTERM", "SIGKILL")


def likely_cause(ended, said):
    """(exit code, line) for the job's last line: what happened first. ``ended``: {rank: code or
    signal name}; ``said``: outcomes(). A worker's own failure comes before a silent SIGTERM or
    SIGKILL (torchrun's to the others); another signal (a crash) is the cause itself."""
    killed = sorted(rank for rank, how in ended.items() if isinstance(how, str) and rank not in said)
    failed = [(code, line) for code, line in said.values() if code and "another process of the job" not in line]
    if killed and not (failed and all(ended[rank] in LAUNCHER_SIGNALS for rank in killed)):
        return EXIT_FAILURE, (f"error: rank {killed[0]} was killed by {ended[killed[0]]}, and the job stopped "
                              f"with it; the checkpoints written before stay valid (resume with --resume auto)")
    if failed:  # the likely cause; the others failed because it left
        return failed[0]
    if said:
        return next(iter(said.values()))
    rank = min(ended)
    how = f"signal {ended[rank]}" if isinstance(ended[rank], str) else f"exit code {ended[rank]}"
    return EXIT_FAILURE, f"error: rank {rank} ended with {how} (see above); the job stopped"


def outcomes(errors):
    """{rank: (code, line)} of the workers that ended through train.py, the likely cause first."""
    entries = []
    for path in errors.glob("rank*"):
        code, _, line = path.read_text().partition("\n")
        kind = 0 if code == "2" else 2 if "error: unexpected" in line else 1
        entries.append(((kind, path.stat().st_mtime_ns, path.name), int(path.name.removeprefix("rank")),
                        int(code), line.strip()))
    return {rank: (code, line) for _, rank, code, line in sorted(entries)}


def signalled(name, ended, args):
    """After a passed-on signal: 0 when every worker saved, else the first worker's line and code."""
    local = int(args.nproc_per_node)
    if len(ended) == local and not any(code for code, _ in ended.values()):
        print(f"{name}: every worker on this node stopped cleanly; the run's last line above says what "
              f"was saved", file=sys.stderr, flush=True)
        return 0
    failed = [(code, line) for code, line in ended.values() if code]
    code, line = failed[0] if failed else (
        EXIT_FAILURE, f"error: {name}: {local - len(ended)} worker(s) on this node ended before they could save")
    print(line, file=sys.stderr, flush=True)
    return code


def node_count(args):
    """torchrun's --nnodes: N, or MIN:MAX (--standalone makes it 1:1)."""
    return int(str(args.nnodes).split(":")[-1])


def rendezvous_timeout(args, key="join_timeout", default=600):
    """A wait of torchrun's --rdzv-conf, in seconds (torch's defaults: join 600, last call 30)."""
    conf = dict(item.split("=", 1) for item in args.rdzv_conf.split(",") if "=" in item)
    return int(conf.get(key, default))


def waits(args):
    """What the rendezvous waits for: all the nodes, or under MIN:MAX the first MIN and then, for
    the last call, the rest up to MAX (a job of MIN nodes starts only after it)."""
    low, _, high = str(args.nnodes).partition(":")
    if not high or low == high:
        return f"torchrun waits {rendezvous_timeout(args)} s for them"
    first = "1 node (this one)" if low == "1" else f"{low} nodes (this one included)"
    return (f"torchrun waits up to {rendezvous_timeout(args)} s for {first}, then "
            f"{rendezvous_timeout(args, 'last_call_timeout', 30)} s more (--last-call) for up to {high}")


if __name__ == "__main__":
    from mobilenet.distributed import exit_process
    exit_process(main())
