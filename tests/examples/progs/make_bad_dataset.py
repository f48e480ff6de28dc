"""Write a small ImageNet-layout folder from the digits data with three undecodable images.

Usage: make_bad_dataset.py ROOT [--train-label N] [--val-label N]
train/digit<k>/ holds 24 images per class for 4 classes plus, in digit0/, a truncated JPEG, a
zero-byte file and a text file named .JPEG; val/ holds 8 images per class. --train-label /
--val-label replace the label of the list's last line (a label outside the class set).
"""
import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples",
                                "imagenet"))
import image_lists  # noqa: E402
import digits  # noqa: E402

BAD = ("truncated.JPEG", "empty.JPEG", "text.JPEG")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--train-label", type=int)
    parser.add_argument("--val-label", type=int)
    args = parser.parse_args()
    source = image_lists.read_dataset(os.path.join(digits.ensure_digits_dataset(), "train"))
    entries = {"train": [], "val": []}
    for label in range(4):
        files = [f for f, lab in zip(source.files, source.labels) if lab == label][:32]
        for k, path in enumerate(files):
            split = "train" if k < 24 else "val"
            name = f"digit{label}/{os.path.basename(path)}"
            os.makedirs(os.path.join(args.root, split, f"digit{label}"), exist_ok=True)
            shutil.copy(path, os.path.join(args.root, split, name))
            entries[split].append((name, label))
    folder = os.path.join(args.root, "train", "digit0")
    blob = open(source.files[0], "rb").read()
    open(os.path.join(folder, BAD[0]), "wb").write(blob[:len(blob) // 2])
    open(os.path.join(folder, BAD[1]), "wb").close()
    open(os.path.join(folder, BAD[2]), "w").write("not an image\n")
    entries["train"] += [(f"digit0/{name}", 0) for name in BAD]
    for split, label in (("train", args.train_label), ("val", args.val_label)):
        if label is not None:
            entries[split][-1] = (entries[split][-1][0], label)
        image_lists.write_list(os.path.join(args.root, f"{split}.txt"), entries[split])


if __name__ == "__main__":
    main()
