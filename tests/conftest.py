import json
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mobilenet.data.sources import build_digits
from mobilenet.optim import SETTINGS

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """The bundled demo set, built from scikit-learn's digits into a temporary folder."""
    return build_digits(tmp_path_factory.mktemp("data") / "digits")


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """An in-process run under --distributed sets torch's thread count as torchrun would
    (OMP_NUM_THREADS=1), one with train.deterministic=true torch's deterministic kernels (left on
    by test_boundaries before); later in-process runs must not inherit them: floats depend on them,
    and the resume tests compare weights bit for bit with runs in other processes."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def run_train(*args, cwd=ROOT, timeout=600):
    """python train.py ARGS in a subprocess; returns the CompletedProcess (text output)."""
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def train_here(capfd):
    """train.main(ARGS) in this process: a CompletedProcess without a process's start (seconds of
    imports). ``one_thread``: at one thread, as torchrun starts a job's processes (their float sums)."""
    import train

    def run(*args, one_thread=False):
        capfd.readouterr()
        if one_thread:
            torch.set_num_threads(1)  # torch_threads_kept restores it
        code = train.main([*map(str, args)])
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)
    return run


@pytest.fixture
def refusal(train_here):
    """train_here for a refusal's line: (exit code, file descriptor 2's whole). A real process's
    refusal is tested by test_config.py's test_cli_rejects_unknown_key_and_bad_value."""
    def refuse(*args):
        result = train_here(*args)
        return result.returncode, result.stderr
    return refuse


# Settings that keep a digits run to a few seconds, on the cpu also where a GPU is (the device
# paths are tested by the tests marked cuda).
TINY = ["device=cpu", "model.width_mult=0.25", "model.resolution=32", "train.log_every=5",
        "data.batch_size=32", "data.workers=0"]


# The quick tier (bash scripts/test.sh --quick, pytest -m quick): a test or two per module of the
# package, each cheap: a trained and resumed run, the model, optimizers, amp and apex, EMA, data,
# config and dialects, checkpoints, a signal, a stalled loader, a multi-process launch.
QUICK = ("test_train.py::test_run_directory_and_tensorboard", "test_train.py::test_resume_continues",
         "test_model.py::test_paper_parameter_count", "test_model.py::test_loads_modelzoo_checkpoint",
         "test_ema.py::test_an_update_is_a_few_ops", "test_optim.py::test_fused_update_rule_matches_standard[rmsprop]",
         "test_optim.py::test_implementation_per_impl", "test_config.py::test_resolve_computes",
         "test_config.py::test_every_setting_range", "test_amp.py::test_injected_inf", "test_apex.py::test_a_skipped",
         "test_decode.py::test_same_crop", "test_data_errors.py::test_links_back_up", "test_dialects.py::test_train_py",
         "test_dialects.py::test_every_main_py_flag", "test_checkpoints.py::test_a_run_directory_from_before",
         "test_reliability.py::test_a_save_between", "test_stalls.py::test_a_stuck_loader_worker",
         "test_signals.py::test_sighup_stays_ignored_under_nohup", "test_cluster.py::test_a_bad_setting_under_nproc",
         "test_logging.py::test_modelzoo_scripts_parse", "test_compile.py::test_settings_that_cannot_compile",
         "test_augment.py::test_every_policy_trains_resumes_mid_epoch_exactly_and_changes_the_run[ra]",
         "test_augment.py::test_a_batch_mix_draws", "test_recipes.py::test_each_recipe_is_its_source_command")


def pytest_collection_modifyitems(config, items):
    """Marks the quick tier; tests marked cuda run only where torch sees a CUDA device."""
    for item in items:
        if any(item.nodeid.removeprefix("tests/").startswith(prefix) for prefix in QUICK):
            item.add_marker(pytest.mark.quick)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (scripts/bench_device.sh runs them)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def train_sh(*args, timeout=300, env=None):
    """bash train.sh ARGS in a subprocess; returns the CompletedProcess (text output)."""
    return subprocess.run(["bash", "train.sh", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_tree(root):
    """``root`` and all its descendants, from /proc."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def assert_same_weights(a, b):
    """The weights in run directories ``a`` and ``b`` (checkpoints/last.pt) are bit-identical."""
    from mobilenet.checkpoint import load_checkpoint
    state_a, state_b = (load_checkpoint(run / "checkpoints" / "last.pt")["state_dict"] for run in (a, b))
    assert state_a.keys() == state_b.keys()
    for key, value in state_a.items():
        assert torch.equal(value, state_b[key]), key


# Two processes with loader workers, synthetic data, 40 steps of one epoch, of a model with dropout
# (its draws differ by rank: a resume must give each rank its own random states back).
TWO_RANKS = ["--nproc", "2", *TINY, "--data", "synthetic", "data.synthetic_size=4000", "model.name=mobilenet_v2",
             "model.num_classes=10", "data.batch_size=8", "data.workers=2", "train.log_every=3",
             "train.max_steps_per_epoch=40", "--epochs", "1"]


@pytest.fixture(scope="session")
def straight_two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight2") / "run"
    result = train_sh(*TWO_RANKS, "--output", out)
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def as_from_a_shell():
    """preexec_fn of a child that a test signals: SIGINT, SIGQUIT, SIGTERM and SIGHUP at their
    defaults, as a shell starts a command. In some full runs the pytest process had SIGINT and
    SIGQUIT ignored for a moment (as C's system() does in its caller while its command runs), and
    once SIGHUP (CI, the SIGHUP test: the run went on to its end), and a child forked then
    inherited it, so train.py kept it ignored as under nohup; which thread did it is not found."""
    for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def start_two_ranks(out, *extra):
    """bash train.sh with TWO_RANKS, started in a session of its own (a Popen, text pipes)."""
    return subprocess.Popen(["bash", "train.sh", *map(str, TWO_RANKS), "--output", str(out), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=as_from_a_shell)


def in_small_tmpfs(tmp_path, size, script, **fields):
    """Runs the shell ``script`` with a tmpfs of ``size`` bytes mounted at {mount} (in a user and
    mount namespace: a real file system that fills up); skips where that cannot be mounted."""
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is needed to mount a small tmpfs")
    mount = tmp_path / "disk"
    mount.mkdir()
    script = f"mount -t tmpfs -o size={size} tmpfs {mount} || exit 99\n" + script.format(
        mount=mount, python=sys.executable, train=ROOT / "train.py", **fields)
    result = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    if result.returncode == 99:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    return mount, result


# The two-rank job of every precision and implementation (tests/rank_states.py), shared by test_ranks.py
# and the rank check's own tests (test_behaviour_rank_agreement.py).
BASE_RANKS = ["--config", "configs/demo.yaml", "device=cpu", "model.width_mult=0.25", "model.resolution=32",
        "data.batch_size=16", "data.workers=0",
        "optim.momentum=0.9", "train.log_every=2", "train.max_steps_per_epoch=4", "--epochs", "1"]
EMA = ["train.ema_decay=0.5"]  # O2 refuses an EMA
# ModelZoo's static scale: the first dynamic scale (2**16) overflows every step of so short a run
SCALED = {"O0": [], "O1": ["amp.loss_scale=1024"], "O2": ["amp.loss_scale=1024"]}
VARIANTS = {f"{level}-{implementation}": [*BASE_RANKS, f"amp.level={level}", *SCALED[level], *settings,
                                          *(EMA if level != "O2" else [])]
            for level in ("O0", "O1", "O2") for implementation, settings in SETTINGS.items()}
VARIANTS["apex-O2"] = [*BASE_RANKS, "amp.level=O2", "amp.backend=apex", "optim.impl=fused", *SCALED["O2"]]
VARIANTS["diverged"] = [*BASE_RANKS, "amp.level=O0"]


@pytest.fixture(scope="session")
def ranks(tmp_path_factory, digits):
    """Runs every variant in one torchrun job; returns its folder."""
    out = tmp_path_factory.mktemp("ranks")
    (out / "variants.json").write_text(json.dumps(VARIANTS))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(ROOT / "tests" / "rank_states.py"), str(out), str(digits),
                             str(out / "variants.json")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out
