"""Every row of the three tables a forker adds to, taken from the tables themselves (and a model of
torchvision's that the table does not hold): it trains, resumes exactly from a step in between and
validates. A forker's new row is tested here with no edit."""
import json

import pytest

import train
from conftest import ROOT, TINY, assert_same_weights
from mobilenet.data.sources import SOURCES, Source, source_of
from mobilenet.model import MODELS
from mobilenet.optim import ALGORITHMS


def trains_resumes_and_validates(tmp_path, *settings):
    """Two steps straight, and one step then a resume for the second: the same weights; validated."""
    args = ["--config", "configs/demo.yaml", *TINY, "data.cache_mb=0", "train.max_steps_per_epoch=2", "--epochs", "1",
            *settings]
    assert train.main([*args, "--output", str(tmp_path / "straight")]) == 0
    assert train.main([*args, "--output", str(tmp_path / "resumed"), "train.max_steps=1"]) == 0
    assert train.main([*args, "--output", str(tmp_path / "resumed"), "--resume", "auto"]) == 0
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert summary["global_step"] == 2 and summary["val_images_scored"] > 0


@pytest.mark.parametrize("name", [*sorted(MODELS), "shufflenet_v2_x0_5"])
def test_every_model_trains_resumes_and_validates(tmp_path, name):
    trains_resumes_and_validates(tmp_path, "--data", "digits", f"model.name={name}")


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_trains_resumes_and_validates(tmp_path, name):
    trains_resumes_and_validates(tmp_path, "--data", "digits", f"optim.name={name}")


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_data_source_trains_resumes_and_validates(tmp_path, name):
    path = SOURCES[name].example(tmp_path)
    assert source_of(path) is SOURCES[name]
    trains_resumes_and_validates(tmp_path, "--data", path, "model.num_classes=10")


def test_a_source_claims_its_paths_wherever_it_stands_in_the_table(monkeypatch, tmp_path):
    """A row placed last (after the fallback folder) claims what it is; a path two rows claim is one line."""
    listed = Source(claims=lambda path: str(path).endswith(".csv"), datasets=None, train_images=None,
                    decoded_bytes=None, recipe="imagenet", takes=(), example=None)
    monkeypatch.setitem(SOURCES, "csv", listed)
    assert list(SOURCES)[-1] == "csv" and source_of(str(tmp_path / "files.csv")) is listed
    assert source_of(str(tmp_path)) is SOURCES["folder"]
    monkeypatch.setitem(SOURCES, "csv too", listed)
    with pytest.raises(Exception, match="the sources csv and csv too of data.sources.SOURCES both claim it"):
        source_of("a.csv")


def test_a_behaviour_is_imported_by_its_line_and_its_own_test_file_alone():
    """Deleting a behaviour's module, its line in behaviours_for and tests/test_behaviour_<name>.py
    leaves the rest whole: nothing else in the project names its module (mobilenet/behaviours)."""
    import re
    behaviours = sorted(p.stem for p in (ROOT / "mobilenet" / "behaviours").glob("*.py") if p.stem != "__init__")
    assert behaviours
    files = [p for p in [ROOT / "train.py", *ROOT.glob("mobilenet/**/*.py"), *ROOT.glob("scripts/**/*.py"),
                         *ROOT.glob("tests/*.py")] if p.name != "__init__.py" or p.parent.name != "behaviours"]
    for name in behaviours:
        own = ROOT / "tests" / f"test_behaviour_{name}.py"
        assert own.exists(), f"{name}: its tests belong in {own.name}"
        naming = re.compile(rf"behaviours[./]{name}\b|from mobilenet\.behaviours import .*\b{name}\b")
        others = [str(p.relative_to(ROOT)) for p in files if p not in (own, ROOT / "mobilenet" / "behaviours" /
                                                                       f"{name}.py") and naming.search(p.read_text())]
        assert others == [], f"{name} is imported beside its line and its test file: {others}"
