"""Provenance tags of YAML values: where each number of a recipe or profile comes from.

A value is tagged by a trailing comment; the comment may continue on the next lines (comment
lines indented past the key)::

    sources:                       # citations the tags name (not a training knob)
      v1: 'Mikami et al., "ImageNet/ResNet-50 Training in 224 Seconds", arXiv:1811.05233v1'
    local_batch: 32   # derived: 34,816 / 1,088 [v1]
    epochs: 90        # assumed: the 90-epoch budget of Goyal et al. 2017
    arch: resnet50    # published [v1]: the paper's title

``published`` needs an ``[id]`` of the file's ``sources:`` block (``derived``/``assumed`` may
cite too); :func:`load_tagged` parses a file into (values, tags) and refuses a published tag
without a known source; :func:`untagged` lists the values without a tag.

>>> import io
>>> values, tags = load_tagged(io.StringIO("sources:\\n  v1: arXiv:1811.05233v1\\n"
...                                        "epochs: 90  # assumed: Goyal et al.\\n"))
>>> values["epochs"], tags["epochs"].kind, tags["epochs"].note
(90, 'assumed', 'Goyal et al.')
"""
import re
from collections import namedtuple

from . import safe_yaml

KINDS = ("published", "derived", "assumed")
SOURCES_KEY = "sources"

Tag = namedtuple("Tag", [
    "kind",      # published | derived | assumed
    "sources",   # tuple of source ids cited in [..]
    "note",      # the rest of the comment, continuation lines joined
    "line",      # 1-based line of the value
])

_KEY = re.compile(r"^(\s*)([A-Za-z_][\w.-]*)\s*:(.*)$")
_TAG = re.compile(r"^#\s*(published|derived|assumed)\b\s*(?:\[([^\]]*)\])?\s*:?\s*(.*)$")
_FIX = ("end the line with '# published [source-id]: ...', '# derived: ...' or "
        "'# assumed: ...'")


def _split_comment(text):
    """(value text, comment or '') of the part of a line after ``key:``."""
    quote = None
    for i, ch in enumerate(text):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or text[i - 1].isspace()):
            return text[:i].strip(), text[i:].strip()
    return text.strip(), ""


def _scan(lines):
    """{dotted key: (line number, has a value, comment)} and continuation comments per key."""
    entries, stack, last = {}, [], None
    for number, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if not stripped:
            continue
        indent = len(raw) - len(raw.lstrip())
        if stripped.startswith("#"):
            if last is not None and indent > last[1]:
                entries[last[0]][2].append(stripped.lstrip("#").strip())
            else:
                last = None
            continue
        match = _KEY.match(raw)
        if not match:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([k for _, k in stack] + [match.group(2)])
        value, comment = _split_comment(match.group(3))
        entries[key] = (number, bool(value), [comment] if comment else [])
        stack.append((indent, match.group(2)))
        last = (key, indent)
    return entries


def parse_tags(lines):
    """{dotted key: Tag or None} for every key with a value (None: no tag)."""
    tags = {}
    for key, (number, has_value, comments) in _scan(lines).items():
        if not has_value:
            continue
        match = _TAG.match(comments[0]) if comments else None
        if match is None:
            tags[key] = None
            continue
        ids = tuple(s.strip() for s in (match.group(2) or "").split(",") if s.strip())
        note = " ".join([match.group(3)] + comments[1:]).strip()
        tags[key] = Tag(match.group(1), ids, note, number)
    return tags


def check_sources(tags, sources, where):
    """Raise ValueError for a published tag without a source or a citation of an unknown one."""
    known = sorted(sources or {})
    for key, tag in tags.items():
        if tag is None or key.split(".")[0] == SOURCES_KEY:
            continue
        if tag.kind == "published" and not tag.sources:
            raise ValueError(
                f"{where}: {key} (line {tag.line}) is tagged published without a source; "
                f"write '# published [id]: ...' with id one of {known} (add the citation "
                f"under '{SOURCES_KEY}:'), or tag it derived/assumed")
        missing = [s for s in tag.sources if s not in (sources or {})]
        if missing:
            raise ValueError(
                f"{where}: {key} (line {tag.line}) cites unknown source(s) {missing}; "
                f"known: {known}; add them under '{SOURCES_KEY}:' with title and URL or arXiv id")


def load_tagged(stream, where="<yaml>"):
    """Parse YAML text (a file object) into (values, tags); check the published tags' sources."""
    text = stream.read()
    values = safe_yaml.load(text) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be a mapping of key: value, got {type(values).__name__}")
    tags = parse_tags(text.splitlines())
    sources = values.get(SOURCES_KEY) or {}
    if not isinstance(sources, dict):
        raise ValueError(f"{where}: '{SOURCES_KEY}:' must map source ids to citations")
    check_sources(tags, sources, where)
    return values, tags


def untagged(tags):
    """Keys with a value but no tag (the ``sources:`` entries excepted), in file order."""
    return [k for k, t in tags.items() if t is None and k.split(".")[0] != SOURCES_KEY]


def require_tags(tags, where):
    """Raise ValueError naming the first value without a tag (for audited files)."""
    missing = untagged(tags)
    if missing:
        raise ValueError(f"{where}: {missing[0]} has no provenance tag ({len(missing)} untagged: "
                         f"{missing}); {_FIX}")
