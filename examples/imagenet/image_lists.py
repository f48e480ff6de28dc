"""ImageNet-layout data sets: ``train/<wnid>/*.JPEG`` folders or ``path label`` lists, and
a cheap screen for images DALI cannot decode.

The layout is nnabla-examples' one: a training folder of class folders (label = index of the
folder in sorted order) or any folder plus a list file whose lines are ``relative/path label``
(paths relative to the folder), e.g. ``val/`` + ``val.txt`` with
``ILSVRC2012_val_00000001.JPEG 65``. Labels are checked against the class set (a stray label
is an error in training, left out of the accuracy in validation). ``screen`` reads the first
and last bytes of an image (a format signature, a JPEG/PNG end marker); ``decode_error``
decodes it with PIL. ``tools/make_imagenet_lists.py`` writes the lists (``--verify`` decodes
every image first). Example::

    train_set = read_dataset("imagenet/train", "imagenet/train.txt")   # or class folders only
    train_set.num_classes, len(train_set)
    write_list("val.txt", [("ILSVRC2012_val_00000001.JPEG", 65)])
"""
import os

import numpy as np

from nnabla_torus.files import atomic_open

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
PAD_LABEL = -1             # label of validation padding rows and of labels outside the set


class Dataset:
    """Absolute image paths and their int32 labels; ``num_classes`` = largest label + 1.

    ``bad``: indices of images found undecodable (loaders skip them). ``outside``: (count,
    first line) of list entries whose label is outside ``read_dataset``'s ``num_classes``.
    """

    def __init__(self, root, files, labels):
        self.root = root
        self.files = list(files)
        self.labels = np.asarray(labels, dtype=np.int32)
        self.num_classes = int(self.labels.max()) + 1 if len(self.labels) else 0
        self.bad = set()
        self.screened = np.zeros(len(self.files), bool)
        self.outside = (0, None)
        self.class_names = None    # the class folders' names, label order (None: from a list)

    def __len__(self):
        return len(self.files)


def split_source(root, split):
    """(folder, list file or None) of ``split`` ("train" or "val") under a --data-dir ``root``:
    ``root/<split>.txt`` when it exists, else the class folders of ``root/<split>``. Cheap (no
    image is listed): a ValueError names what is missing and the two layouts that work."""
    folder, listing = os.path.join(root, split), os.path.join(root, f"{split}.txt")
    layouts = (f"class folders {folder}/<class>/*.JPEG, or images under {folder} named with "
               f"their labels in {listing} ('path label' lines; tools/make_imagenet_lists.py "
               f"writes them)")
    if not os.path.isdir(folder):
        raise ValueError(f"--data-dir {root} has no {split}/ folder; expected {layouts}")
    if os.path.isfile(listing):
        return folder, listing
    if not any(e.is_dir() for e in os.scandir(folder)):
        raise ValueError(f"--data-dir {root}: {folder} has no class folders and {listing} does "
                         f"not exist; expected {layouts}")
    return folder, None


def read_dataset(image_dir, list_file=None, num_classes=None, class_names=None):
    """Read an image folder: class folders when ``list_file`` is None, else a ``path label`` list.

    Without ``num_classes`` (a training set) the list's labels must be 0..K-1 for its K
    distinct labels: a label beyond that (a typo such as 999 among 10 classes would train a
    1,000-class model) raises ValueError naming the line. With ``num_classes`` (a validation
    set) labels >= num_classes become ``PAD_LABEL`` (left out of accuracy) and are counted in
    ``dataset.outside``. Class folders of a validation set take the labels of the training
    set's ``class_names`` (a folder of another name is left out of accuracy likewise). Raises
    FileNotFoundError / ValueError naming the folder, file or line at fault.
    """
    image_dir = os.path.abspath(os.path.expanduser(image_dir))
    if not os.path.isdir(image_dir):
        raise FileNotFoundError(
            f"image folder {image_dir} does not exist; pass a folder holding <class>/*.JPEG "
            f"(or images named in a list file), or leave the data flags unset to use the "
            f"embedded digits dataset")
    if list_file is None:
        names = sorted(e.name for e in os.scandir(image_dir) if e.is_dir())
        files, labels = scan_class_folders(image_dir)
        if class_names is not None:          # validation folders: the training labels by name
            by_name = {name: label for label, name in enumerate(class_names)}
            folder_label = np.array([by_name.get(name, PAD_LABEL) for name in names], np.int32)
            labels = folder_label[np.asarray(labels, np.int64)] if labels else []
        dataset = Dataset(image_dir, files, labels)
        dataset.class_names = class_names or names
        outside = np.flatnonzero(dataset.labels == PAD_LABEL)
        if len(outside):
            dataset.outside = (len(outside), dataset.files[outside[0]])
        return dataset
    files, labels, lines = read_list(list_file, image_dir)
    labels = np.asarray(labels, np.int32)
    limit = len(np.unique(labels)) if num_classes is None else num_classes
    outside = np.flatnonzero(labels >= limit)
    if len(outside) and num_classes is None:
        first = outside[0]
        raise ValueError(f"{list_file}:{lines[first]}: label {labels[first]} is outside the "
                         f"class set 0..{limit - 1} ({limit} distinct labels; labels must be "
                         f"0..K-1 without gaps); fix the line or rewrite the list with "
                         f"tools/make_imagenet_lists.py")
    dataset = Dataset(image_dir, files, np.where(labels >= limit, PAD_LABEL, labels))
    if len(outside):
        dataset.outside = (len(outside), f"{list_file}:{lines[outside[0]]}")
    return dataset


def scan_class_folders(image_dir):
    """Return (absolute paths, labels) of ``image_dir/<class>/*.JPEG``, classes in sorted order."""
    classes = sorted(e.name for e in os.scandir(image_dir) if e.is_dir())
    if not classes:
        raise FileNotFoundError(
            f"no class folders in {image_dir}; expected {image_dir}/<class>/*.JPEG, or pass a "
            f"'path label' list file for a flat folder (tools/make_imagenet_lists.py writes one)")
    files, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(image_dir, name)
        images = sorted(e.name for e in os.scandir(folder)
                        if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS))
        if not images:
            raise FileNotFoundError(
                f"class folder {folder} holds no images ({', '.join(IMAGE_EXTENSIONS)}); "
                f"remove it or add its images")
        files += [os.path.join(folder, f) for f in images]
        labels += [label] * len(images)
    return files, labels


def read_list(list_file, image_dir):
    """Return (paths, labels, line numbers) of a ``relative/path label`` list under ``image_dir``.

    Every named image must exist."""
    list_file = os.path.abspath(os.path.expanduser(list_file))
    if not os.path.isfile(list_file):
        raise FileNotFoundError(f"list file {list_file} does not exist; write it with "
                                f"tools/make_imagenet_lists.py")
    files, labels, lines = [], [], []
    with open(list_file) as f:
        for number, line in enumerate(f, 1):
            try:
                entry = parse_list_line(line)
            except ValueError as e:
                raise ValueError(f"{list_file}:{number}: {e}") from None
            if entry is None:
                continue
            files.append(os.path.join(image_dir, entry[0]))
            labels.append(entry[1])
            lines.append(number)
    if not files:
        raise ValueError(f"list file {list_file} names no images")
    _check_files_exist(files, list_file)
    return files, labels, lines


def _check_files_exist(files, list_file):
    # One directory listing per folder instead of one stat per image: ImageNet's 1.28M images
    # sit in 1,000 folders, so this takes seconds, not minutes, on network file systems.
    listings = {}
    missing = []
    for path in files:
        folder, name = os.path.split(path)
        if folder not in listings:
            listings[folder] = set(os.listdir(folder)) if os.path.isdir(folder) else set()
        if name not in listings[folder]:
            missing.append(path)
    if missing:
        raise FileNotFoundError(f"{len(missing)} image(s) named in {list_file} do not exist, "
                                f"first: {missing[0]}; fix the list or the image folder")


# Leading bytes of the formats DALI decodes, and the end marker of those that have one.
SIGNATURES = ((b"\xff\xd8\xff", b"\xff\xd9"), (b"\x89PNG\r\n\x1a\n", b"IEND"), (b"BM", b""),
              (b"II*\x00", b""), (b"MM\x00*", b""), (b"RIFF", b""), (b"\x00\x00\x00\x0cjP", b""),
              (b"P1", b""), (b"P2", b""), (b"P3", b""), (b"P4", b""), (b"P5", b""), (b"P6", b""))
TAIL_BYTES = 1024   # the end marker must lie in the last TAIL_BYTES (some files carry padding)


def screen(path):
    """Return why ``path`` is surely not a decodable image (empty, unknown format, no end
    marker: truncated), or None. Reads at most 16 + TAIL_BYTES bytes."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
            f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL_BYTES))
            tail = f.read()
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    if not head:
        return "empty file"
    for magic, end in SIGNATURES:
        if head.startswith(magic):
            return None if end in tail else "truncated (no end marker)"
    return f"not an image (starts with {head[:8]!r})"


def decode_error(path):
    """Return why PIL cannot decode the image at ``path`` (a short text), or None if it can."""
    from PIL import Image
    try:
        with Image.open(path) as image:
            image.load()                 # open() reads only the header; load() decodes it all
    except Exception as error:           # PIL raises OSError, SyntaxError, ValueError, ...
        return f"{type(error).__name__}: {error}"
    return None


def list_line(name, label):
    """The list-file line of image ``name`` (relative path; spaces allowed) with ``label``.

    ValueError for a name that would not read back the same (:func:`parse_list_line`): one
    with a line break or leading/trailing white space."""
    if name != name.strip() or "\n" in name or "\r" in name or not name:
        raise ValueError(f"image name {name!r} has leading/trailing white space or a line "
                         f"break, which a 'path label' list cannot hold; rename the file")
    return f"{name} {int(label)}\n"


def parse_list_line(line):
    """(name, label) of a ``relative/path label`` line (the name may hold spaces: the label is
    the last field), None for a blank line; ValueError for anything else."""
    fields = line.strip().rsplit(None, 1)
    if not fields:
        return None
    if len(fields) != 2 or not fields[1].isascii() or not fields[1].isdigit():
        raise ValueError(f"expected 'relative/path.JPEG label' with a label >= 0, got "
                         f"{line.rstrip()!r}")
    return fields[0], int(fields[1])


def write_list(path, entries):
    """Write ``(relative path, label)`` pairs as a ``path label`` list file (read_list reads
    it back: both go through list_line / parse_list_line)."""
    lines = [list_line(name, label) for name, label in entries]
    with atomic_open(path, "w") as f:
        f.writelines(lines)
