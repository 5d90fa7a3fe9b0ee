"""The bundled demo set: scikit-learn's 1,797 handwritten digits (real 8x8 scans, 10 classes), written
once as an ImageFolder of 32x32 JPEGs under data/digits. Rebuild: rm -r data/digits, then
python -m mobilenet.data.demo
"""
import os
import shutil
import tempfile
from pathlib import Path

from PIL import Image

DIGITS_ROOT = Path(__file__).resolve().parents[2] / "data" / "digits"
TRAIN_IMAGES = 1437  # of the 1,797, with build_digits' val_fraction 0.2


def build_digits(root=DIGITS_ROOT, size=32, val_fraction=0.2, seed=0):
    """Writes scikit-learn's 1,797 handwritten digits (real scans, 8x8) as an ImageFolder of JPEGs.

    Stratified train/val split; built in a temporary folder and renamed, so it is never partial.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images * (255 / 16)).round().astype("uint8")
    split = train_test_split(range(len(images)), test_size=val_fraction, random_state=seed,
                             stratify=digits.target)
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".digits-"))
    for subset, indices in zip(("train", "val"), split):
        for i in indices:
            folder = tmp / subset / str(digits.target[i])
            folder.mkdir(parents=True, exist_ok=True)
            image = Image.fromarray(images[i]).resize((size, size), Image.BILINEAR).convert("RGB")
            image.save(folder / f"{i:04d}.jpg", quality=95)
    try:
        os.rename(tmp, root)
    except OSError:  # built meanwhile by another process
        shutil.rmtree(tmp)
    return root


if __name__ == "__main__":
    print(build_digits())
