"""The unreadable-classes behaviour (mobilenet/behaviours/unreadable_classes.py)."""
import shutil
import train
from conftest import TINY


def test_a_class_whose_files_are_all_unreadable_is_said_once_per_class(tmp_path, digits, capsys):
    data = tmp_path / "data"
    shutil.copytree(digits, data)
    for folder in (data / "train" / "5", data / "val" / "6"):
        for path in folder.iterdir():
            path.write_bytes(b"not an image")
    capsys.readouterr()
    assert train.main(["--config", "configs/demo.yaml", *TINY, "--data", str(data), "--output", str(tmp_path / "run"),
                       "--epochs", "2"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: class")]
    trained_files, val_files = len(list((data / "train" / "5").iterdir())), len(list((data / "val" / "6").iterdir()))
    assert said == [f"warning: class '5' (train): none of its {trained_files} files could be read, so no image of it "
                    f"is trained on; fix its files or remove the class folder from train/ and val/",
                    f"warning: class '6' (val): none of its {val_files} files could be read, so it is left out of "
                    f"the accuracy; fix its files or remove the class folder from train/ and val/"]
