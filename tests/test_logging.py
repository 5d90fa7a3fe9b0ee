"""The console log as tools read it: Ascend ModelZoo's own parse commands, elapsed time and ETAs."""
import json
import re
import subprocess

import pytest

from conftest import TINY, run_train


@pytest.fixture(scope="module")
def logged_run(digits, tmp_path_factory):
    """A real run's stdout in a file (2 epochs, EMA on so that its accuracy line is there too)."""
    out = tmp_path_factory.mktemp("logged") / "run"
    result = run_train("--config", "configs/demo.yaml", "--data", digits, "--output", out, *TINY,
                       "train.max_steps_per_epoch=10", "--epochs", "2", "train.ema_decay=0.9")
    assert result.returncode == 0, result.stderr[-2000:]
    log = out / "train.log"
    log.write_text(result.stdout)
    return log, out


def shell(command, log):
    return subprocess.run(["bash", "-c", command.replace("LOG", str(log))], capture_output=True,
                          text=True, check=True).stdout.split()


def test_modelzoo_scripts_parse_fps_loss_and_accuracy(logged_run):
    log, out = logged_run
    summary = json.loads((out / "summary.json").read_text())
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
             if '"train"' in line]
    # their performance scripts' commands, verbatim
    fps = shell("grep -a 'img/s' LOG | awk '{print $9}' | awk 'END {print}'", log)
    losses = shell("grep Epoch: LOG | awk '{print $14}'", log)
    accuracy = shell("grep -a '* Prec@1' LOG | awk 'END {print}' | awk '{print $3}'", log)
    last_progress = [line for line in log.read_text().splitlines() if "img/s" in line][-1]
    assert last_progress.startswith("Epoch: [1][10/10]")
    assert fps == [re.search(r"img/s ([\d.]+)", last_progress).group(1)] and float(fps[0]) > 0
    assert losses == [f"{r['loss']:.4f}" for r in train] and len(losses) == 4
    assert accuracy == [f"{summary['top1']:.3f}"]
    assert " * EMA Prec@1" in log.read_text()  # the model's line, not the EMA's, is the last ' * Prec@1'


def test_progress_lines_carry_elapsed_time_and_etas(logged_run):
    log, _ = logged_run
    lines = [line for line in log.read_text().splitlines() if line.startswith("Epoch:")]
    clock = r"(\d+):(\d\d):(\d\d)"
    times = []
    for line in lines:
        match = re.search(rf"eta {clock} epoch, {clock} run .* elapsed {clock}$", line)
        assert match, line
        h1, m1, s1, h2, m2, s2, h3, m3, s3 = map(int, match.groups())
        times.append((3600 * h1 + 60 * m1 + s1, 3600 * h2 + 60 * m2 + s2, 3600 * h3 + 60 * m3 + s3))
    assert all(run >= epoch for epoch, run, _ in times)
    assert times[-1][0] == times[-1][1]  # in the last epoch, the run ends with the epoch
    assert [t[2] for t in times] == sorted(t[2] for t in times)


def test_running_img_per_s_leaves_out_the_first_interval(logged_run):
    """Two log intervals an epoch: the first line shows its own interval's rate, the second the
    rate since the first ended (the warm-up interval left out), i.e. the second interval's."""
    log, out = logged_run
    rates = [r["img_per_s"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "train"]  # each interval's own rate, in the order of the lines
    lines = [line for line in log.read_text().splitlines() if line.startswith("Epoch:")]
    assert len(lines) == len(rates) == 4
    for line, rate in zip(lines, rates):
        assert float(line.split()[8]) == pytest.approx(rate, abs=0.051), line


def test_a_run_directory_removed_mid_run_is_named_as_such(tmp_path, digits):
    import shutil
    import subprocess
    import sys
    from conftest import ROOT, TINY
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "--config", "configs/demo.yaml", "--data",
                             str(digits), "--output", str(out), *TINY, "train.log_every=1", "--epochs", "30"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("Epoch:"):
            out.rename(tmp_path / "gone")  # as rm -r: the path no longer leads to the run's files
            shutil.rmtree(tmp_path / "gone", ignore_errors=True)
            break
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert stderr.strip().splitlines()[-1] == (f"error: {out}: the run directory was removed while the run wrote "
                                               f"to it; stopped (nothing more can be saved there)")
