"""Write ``train.txt`` / ``val.txt`` ("relative/path label" lists) for an ImageNet-layout folder.

Class index = position of the wnid folder of the training set in sorted order (the order
nnabla-examples and torchvision use). Validation images are either in class folders
(``val/<wnid>/*.JPEG``) or flat (``val/*.JPEG``) with a mapping file whose lines are
``ILSVRC2012_val_00000001.JPEG n01751748`` (image name with or without extension, then wnid), or
Kaggle's ``LOC_val_solution.csv`` (``ImageId,PredictionString`` whose first word is the wnid).

``--verify 1`` decodes every image once (PIL, ``--workers`` processes; a progress bar on a
terminal) and leaves the undecodable ones (truncated, empty, not an image) out of the lists,
naming each with the reason and giving the count. Example::

    python tools/make_imagenet_lists.py --train-dir ~/imagenet/train --val-dir ~/imagenet/val \\
        --val-map ~/imagenet/LOC_val_solution.csv            # writes ~/imagenet/{train,val}.txt
    mpirun -np 4 python examples/imagenet/train.py --data-dir ~/imagenet
"""
import argparse
import csv
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import _example  # noqa: F401  (examples/imagenet on sys.path, for its image_lists module)
from image_lists import IMAGE_EXTENSIONS, decode_error, scan_class_folders, write_list
from nnabla_torus.knobs import add_knob, check_output_path, number


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_knob(parser, "--train-dir", env="NNABLA_TORUS_TRAIN_DIR", default=None,
             help="training folder holding <wnid>/*.JPEG (required)")
    add_knob(parser, "--val-dir", env="NNABLA_TORUS_VAL_DIR", default=None,
             help="validation folder, flat or with <wnid>/ folders; none: no val.txt")
    add_knob(parser, "--val-map", env="NNABLA_TORUS_VAL_MAP", default=None,
             help="'image wnid' lines or LOC_val_solution.csv, for a flat validation folder")
    add_knob(parser, "--out-dir", env="NNABLA_TORUS_LIST_DIR", default=None,
             help="where train.txt/val.txt go; none: the parent of --train-dir")
    add_knob(parser, "--verify", env="NNABLA_TORUS_VERIFY", default=False, type=bool,
             help="decode every image once and leave the undecodable ones out of the lists")
    add_knob(parser, "--workers", env="NNABLA_TORUS_VERIFY_WORKERS", default=os.cpu_count(),
             type=number(int, low=1), help="processes decoding in parallel with --verify")
    return parser


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.train_dir is None:
        parser.error("--train-dir (or NNABLA_TORUS_TRAIN_DIR) is required")
    # Checked before any work: a wrong --val-dir must not cost a --verify of the training set.
    for flag, path, exists in (("--train-dir", args.train_dir, os.path.isdir),
                               ("--val-dir", args.val_dir, os.path.isdir),
                               ("--val-map", args.val_map, os.path.isfile)):
        if path and not exists(os.path.expanduser(path)):
            parser.error(f"{flag} {path} does not exist")
    return args


def verify(paths, workers):
    """Return {path: reason} of the images in ``paths`` that do not decode (each decoded once)."""
    if workers == 1:
        reasons = map(decode_error, paths)
    else:
        pool = ProcessPoolExecutor(workers)
        reasons = pool.map(decode_error, paths, chunksize=max(1, min(256, len(paths) // workers)))
    if sys.stderr.isatty():
        from tqdm import tqdm
        reasons = tqdm(reasons, total=len(paths), unit="img", desc="verify")
    bad = {path: reason for path, reason in zip(paths, reasons) if reason}
    if workers > 1:
        pool.shutdown()
    return bad


def keep_decodable(entries, folder, workers, list_name):
    """``entries`` without the images that do not decode; print those with the count."""
    bad = verify([os.path.join(folder, name) for name, _ in entries], workers)
    if bad:
        print(f"{list_name}: {len(bad)} of {len(entries)} image(s) do not decode, left out:")
        for path, reason in bad.items():
            print(f"  {path}: {reason}")
    return [e for e in entries if os.path.join(folder, e[0]) not in bad]


def train_entries(train_dir):
    """Return (entries, wnid -> index) for a class-folder training set."""
    files, labels = scan_class_folders(train_dir)
    entries = [(os.path.relpath(f, train_dir), label) for f, label in zip(files, labels)]
    classes = {os.path.basename(os.path.dirname(f)): label for f, label in zip(files, labels)}
    return entries, classes


def val_entries(val_dir, classes, val_map=None):
    """Return validation entries labelled with the training set's class indices."""
    if not os.path.isdir(val_dir):
        raise FileNotFoundError(f"validation folder {val_dir} does not exist")
    if val_map is None:
        if not any(e.is_dir() for e in os.scandir(val_dir)):
            raise FileNotFoundError(f"validation folder {val_dir} has no class folders; pass "
                                    f"--val-map with the class of each image")
        files, _ = scan_class_folders(val_dir)
        wnids = [os.path.basename(os.path.dirname(f)) for f in files]
        return [(os.path.relpath(f, val_dir), _index(w, classes, val_dir))
                for f, w in zip(files, wnids)]
    images = {os.path.splitext(e.name)[0]: e.name for e in os.scandir(val_dir)
              if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS)}
    entries = []
    for image, wnid in read_val_map(val_map):
        stem = os.path.splitext(image)[0]
        if stem not in images:
            raise FileNotFoundError(f"{val_map} names {image}, which is not in {val_dir}")
        entries.append((images[stem], _index(wnid, classes, val_map)))
    return sorted(entries)


def read_val_map(path):
    """Yield (image name, wnid) from 'image wnid' lines or a LOC_val_solution.csv file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"validation mapping file {path} does not exist")
    with open(path, newline="") as f:
        if path.endswith(".csv"):
            for number, row in enumerate(csv.reader(f), 1):
                if number == 1 and row[:1] == ["ImageId"]:
                    continue
                if len(row) != 2 or not row[1].split():
                    raise ValueError(f"{path}:{number}: expected 'ImageId,wnid ...', got {row}")
                yield row[0], row[1].split()[0]
            return
        for number, line in enumerate(f, 1):
            fields = line.strip().rsplit(None, 1)    # the wnid is the last field
            if fields and len(fields) != 2:
                raise ValueError(f"{path}:{number}: expected 'image wnid', got {line.rstrip()!r}")
            if fields:
                yield fields[0], fields[1]


def _index(wnid, classes, source):
    if wnid not in classes:
        raise ValueError(f"class {wnid!r} in {source} has no folder in the training set")
    return classes[wnid]


def main(argv=None):
    args = parse_args(argv)
    try:
        write_lists(args)
    except (OSError, ValueError) as e:   # an empty class folder, a flat val folder, a bad name
        raise SystemExit(f"error: {e}") from None


def write_lists(args):
    """Write train.txt (and val.txt) for parsed ``args``."""
    train_dir = os.path.abspath(os.path.expanduser(args.train_dir))
    out_dir = args.out_dir or os.path.dirname(train_dir)
    check_output_path("--out-dir", out_dir, folder=True)   # before hours of --verify
    os.makedirs(out_dir, exist_ok=True)
    entries, classes = train_entries(train_dir)
    if args.verify:
        entries = keep_decodable(entries, train_dir, args.workers, "train.txt")
    write_list(os.path.join(out_dir, "train.txt"), entries)
    print(f"{os.path.join(out_dir, 'train.txt')}: {len(entries)} images, {len(classes)} classes")
    if args.val_dir:
        val_dir = os.path.abspath(os.path.expanduser(args.val_dir))
        entries = val_entries(val_dir, classes, args.val_map)
        if args.verify:
            entries = keep_decodable(entries, val_dir, args.workers, "val.txt")
        write_list(os.path.join(out_dir, "val.txt"), entries)
        print(f"{os.path.join(out_dir, 'val.txt')}: {len(entries)} images")


if __name__ == "__main__":
    main()
