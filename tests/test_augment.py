"""Augmentation (mobilenet/data/transforms.py): every policy row trains, resumes mid-epoch bit-identically
with random erasing, MixUp/CutMix and repeated augmentation on, whatever the loader's workers;
2 processes train what 1 process accumulating 2 forwards trains; the prepared set takes it, device
decode refuses it in one line; bad values are one line and exit 2."""
import json
from collections import Counter

import pytest
import torch

import train
from conftest import TINY, assert_same_weights, train_sh
from mobilenet.checkpoint import load_checkpoint
from mobilenet.config import build_config, resolve
from mobilenet.data.transforms import POLICIES
from mobilenet.training import BatchMix
from mobilenet.data.datasets import ResumableSampler
from mobilenet.data.sources import SOURCES
from mobilenet.errors import UsageError
from test_accumulation import ONE_THREAD, RUN, weights

EVERYTHING = ["augment.random_erase=0.5", "augment.mixup_alpha=0.2", "augment.cutmix_alpha=1.0", "augment.ra_reps=2"]


def demo(tmp_path, name, *settings):
    args = ["--config", "configs/demo.yaml", *TINY, "data.cache_mb=0", "train.max_steps_per_epoch=2", "--epochs", "1",
            "--data", "digits", *settings, "--output", str(tmp_path / name)]
    assert train.main(args) == 0
    return tmp_path / name


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_trains_resumes_mid_epoch_exactly_and_changes_the_run(tmp_path, policy):
    """Each row with random erasing, MixUp/CutMix and repeated augmentation: two steps straight equal
    one step, a resume and the second; and the run is not the one without augmentation."""
    settings = [f"augment.policy={policy}", *EVERYTHING]
    straight = demo(tmp_path, "straight", *settings)
    demo(tmp_path, "resumed", *settings, "train.max_steps=1")
    resumed = demo(tmp_path, "resumed", *settings, "--resume", "auto")
    assert_same_weights(straight, resumed)
    assert json.loads((resumed / "summary.json").read_text())["global_step"] == 2
    plain = load_checkpoint(demo(tmp_path, "plain") / "checkpoints" / "last.pt")["state_dict"]
    ours = load_checkpoint(straight / "checkpoints" / "last.pt")["state_dict"]
    assert any(not torch.equal(plain[key], ours[key]) for key in ours)


def test_the_draws_are_the_samples_own_whatever_the_workers(tmp_path):
    settings = ["augment.policy=ra", "augment.random_erase=0.5", "data.interpolation=nearest"]
    assert_same_weights(demo(tmp_path, "none", *settings), demo(tmp_path, "two", *settings, "data.workers=2"))


def test_the_prepared_set_takes_a_policy_and_resumes_exactly(tmp_path):
    path = SOURCES["prepared"].example(tmp_path)
    settings = ["--data", path, "augment.policy=ta_wide", "augment.random_erase=0.3"]
    straight = demo(tmp_path, "straight", *settings)
    demo(tmp_path, "resumed", *settings, "train.max_steps=1")
    assert_same_weights(straight, demo(tmp_path, "resumed", *settings, "--resume", "auto"))


@pytest.fixture(scope="module")
def two_processes_augmented(tmp_path_factory, digits):
    out = tmp_path_factory.mktemp("two") / "run"
    result = train_sh("--nproc", "2", *RUN, *EVERYTHING, "augment.policy=augmix", "--data", digits,
                      "--output", out, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def test_one_process_accumulating_two_forwards_draws_what_two_processes_draw(two_processes_augmented, digits,
                                                                              tmp_path, train_here):
    one = train_here(*RUN, *EVERYTHING, "augment.policy=augmix", "--data", digits, "--grad-accum-steps", "2",
                     "--output", tmp_path / "one", one_thread=True)
    assert one.returncode == 0, one.stderr[-2000:]
    ours, theirs = weights(tmp_path / "one"), weights(two_processes_augmented)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_repeated_augmentation_deals_each_image_to_consecutive_ranks_with_seeds_of_their_own():
    """ra_reps 3 over 3 virtual ranks (3 processes, or 1 accumulating 3): each global batch holds
    each of its images 3 times, one per rank, each copy with its own seed; and the same seeds on
    1 process accumulating 3 as on 3 processes."""
    three = [list(ResumableSampler(96, rank, 3, seed=1, batch=4, reps=3)) for rank in range(3)]
    for step in range(8):
        keys = [key for rank in three for key in rank[step * 4:(step + 1) * 4]]
        assert set(Counter(index for index, _ in keys).values()) == {3}
        assert len({seed for _, seed in keys}) == 12
    one = list(ResumableSampler(96, 0, 1, seed=1, batch=4, accumulation=3, reps=3))
    by_rank = [key for step in range(8) for rank in three for key in rank[step * 4:(step + 1) * 4]]
    assert one == by_rank


def test_a_batch_mix_draws_from_its_position_alone():
    """The same (epoch, step, virtual rank): the same mix, whatever was drawn before; another: another."""
    mix = BatchMix({"mixup_alpha": 0.2, "cutmix_alpha": 1.0}, 10, seed=0)
    images, labels = torch.randn(8, 3, 16, 16), torch.arange(8)
    first = mix(images, labels, epoch=1, step=2, virtual_rank=3)
    torch.rand(100)
    again = mix(images, labels, epoch=1, step=2, virtual_rank=3)
    other = mix(images, labels, epoch=1, step=2, virtual_rank=4)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], other[1])
    assert first[1].shape == (8, 10) and torch.allclose(first[1].sum(1), torch.ones(8))


@pytest.mark.parametrize("override,message", [
    ("augment.policy=autoaugment", "'augment.policy' must be one of augmix|cifar10|imagenet|none|ra|svhn|ta_wide"),
    ("augment.mixup_alpha=-0.1", "'augment.mixup_alpha' must be at least 0, got -0.1"),
    ("augment.cutmix_alpha=-1", "'augment.cutmix_alpha' must be at least 0, got -1"),
    ("augment.ra_reps=0", "'augment.ra_reps' must be at least 1, got 0"),
    ("augment.random_erase=1.5", "'augment.random_erase' must be at least 0 and at most 1, got 1.5"),
    ("augment.ra_magnitude=31", "'augment.ra_magnitude' must be at least 0 and at most 30, got 31"),
    ("data.interpolation=lanczos", "'data.interpolation' must be one of bicubic|bilinear|nearest"),
    ("data.interpolation=bicubic augment.policy=ra".split(), "transforms.v2's policies on tensors take nearest or "
     "bilinear"),
])
def test_bad_augmentation_values_are_one_line_and_exit_2(override, message, capsys):
    assert train.main(["--data", "digits", *([override] if isinstance(override, str) else override)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0], error


def test_device_decode_refuses_what_runs_in_the_workers_and_auto_takes_the_workers():
    with pytest.raises(UsageError, match="data.decode=device crops on the device, which takes no "
                                         "augment.policy=imagenet; use data.decode=workers"):
        resolve(build_config(None, ["data.decode=device", "augment.policy=imagenet"]))
    cfg = resolve(build_config(None, ["augment.random_erase=0.1", "device=cpu"]))
    assert cfg["derived"]["decode"] == "workers"
    mixed = resolve(build_config(None, ["data.decode=device", "augment.mixup_alpha=0.2"]))  # on the batch
    assert mixed["derived"]["decode"] == "device"


def test_what_a_row_or_a_source_does_not_take_is_said():
    cfg = resolve(build_config(None, ["data.path=synthetic", "augment.policy=imagenet", "augment.ra_magnitude=5",
                                      "device=cpu"]))
    assert list(cfg["derived"]["not_taken"]) == [
        "augment.policy=imagenet: synthetic does not take it (it takes data.synthetic_size); ignored",
        "augment.ra_magnitude=5: augment.policy=imagenet does not take it (it takes none of augment.ra_magnitude, "
        "augment.augmix_severity); ignored"]


def test_a_mid_epoch_resume_with_other_repetitions_is_one_line(tmp_path, capsys):
    """augment.ra_reps deals the epoch's images: another value mid-epoch is refused, naming the way on."""
    demo(tmp_path, "run", "augment.ra_reps=2", "train.max_steps=1")
    capsys.readouterr()
    args = ["--config", "configs/demo.yaml", *TINY, "data.cache_mb=0", "train.max_steps_per_epoch=2", "--epochs", "1",
            "--data", "digits", "augment.ra_reps=3", "--output", str(tmp_path / "run"), "--resume", "auto"]
    assert train.main(args) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "with augment.ra_reps=2; this run's 3 deals the epoch in another order" in error[0]
    assert train.main([*args, "train.resume_next_epoch=true"]) == 0


@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest"])
def test_each_interpolation_resizes_as_torchvisions_v2_resize(mode):
    from torchvision.transforms.v2 import InterpolationMode, functional

    from mobilenet.data.transforms import resize
    pixels = torch.randint(0, 256, (3, 37, 53), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    theirs = functional.resize(pixels, [20, 24], interpolation=InterpolationMode(mode), antialias=True)
    assert torch.equal(resize(pixels, 20, 24, mode), theirs)
