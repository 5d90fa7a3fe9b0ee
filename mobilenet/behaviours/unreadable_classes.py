"""A class whose files were all found unreadable (by any process) is said once a run, at the end
of the epoch that found it: none of it is trained on, or it is left out of the accuracy. (A class
folder with no file at all is refused when the data is scanned.)"""
import torch

from mobilenet.validation import unreadable_anywhere


class UnreadableClasses:
    def __init__(self):
        self.said = set()

    def at_epoch_end(self, r, results):
        for split, loader in (("train", r.train_loader), ("val", r.val_loader)):
            if not len(loader.dataset.unreadable):  # synthetic
                continue
            for index, files in wholly_unreadable(loader.dataset, r.device):
                if (split, index) not in self.said:
                    self.said.add((split, index))
                    effect = "no image of it is trained on" if split == "train" else "it is left out of the accuracy"
                    r.log.info(f"warning: class {loader.dataset.classes[index]!r} ({split}): none of its {files} "
                               f"files could be read, so {effect}; fix its files or remove the class folder from "
                               f"train/ and val/")


def wholly_unreadable(dataset, device):
    """[(class index, file count)] of the classes of ``dataset`` whose every file some process found unreadable."""
    flags = unreadable_anywhere(dataset, device)
    targets = torch.tensor(dataset.targets)
    files = torch.bincount(targets, minlength=len(dataset.classes))
    unread = torch.bincount(targets[flags], minlength=len(files))
    return [(index, int(files[index])) for index in ((unread == files) & (files > 0)).nonzero().flatten().tolist()]
