"""Knobs: every setting is a CLI flag with an environment-variable twin and a documented default.

Precedence is CLI > environment > default; a file of settings, where a tool has one (the
example's recipes), ranks below the environment (docs/imagenet.md, "Where each setting comes
from"). Example::

    parser = argparse.ArgumentParser()
    add_knob(parser, "--grid", env="NNABLA_TORUS_GRID", default=None,
             help="process grid XxY for torus2d")
    args = parser.parse_args()   # --grid 2x4, or NNABLA_TORUS_GRID=2x4, or None

Numbers are checked where they are parsed: ``type=number(int, low=1)`` refuses 0 with
"argument --batch: must be an integer >= 1, got '0'" (or names the environment variable).
"""
import argparse
import math
import os


# The longest collective timeout every consumer can honour, seconds: nnabla's MPI watchdog
# (its timeout set to ours by the NCCL backend, warning only) reads NNABLA_MPI_WATCH_DOG_TIMEOUT
# with std::stoi and keeps it in an int32 of milliseconds (nnabla-ext-cuda v1.39.0,
# src/nbla/cuda/communicator/watch_dog.cpp), so 2,147,483 s (24.8 days); threading's
# TIMEOUT_MAX (our watchdog's Condition.wait) is larger on every platform.
TIMEOUT_MAX_S = 2_147_483


class BadValue(argparse.ArgumentTypeError, ValueError):
    """A value outside its allowed range; argparse prints the text after the flag's name."""


def number(kind=float, low=None, strict=False, high=None, hint="", strict_high=False):
    """A parser for ``type=`` and :func:`env_value`: ``kind(text)``, finite, >= ``low`` (> when
    ``strict``) and <= ``high`` (< when ``strict_high``); else BadValue saying the allowed range
    and ``hint``.

    >>> number(int, low=1)("8"), number(float, low=0, strict=True)("2.5")
    (8, 2.5)
    """
    what = "an integer" if kind is int else "a finite number"
    bound = "d" if kind is int else "g"      # integers in full: 2147483647, not 2.14748e+09
    if low is not None:
        what += f" {'>' if strict else '>='} {low:{bound}}"
    if high is not None:
        what += f"{' and' if low is not None else ''} {'<' if strict_high else '<='} {high:{bound}}"
    what += f" ({hint})" if hint else ""

    def parse(text):
        try:
            value = kind(text)
            if kind is int and isinstance(text, float) and not text.is_integer():
                raise ValueError(text)
        except (TypeError, ValueError):
            raise BadValue(f"must be {what}, got {text!r}") from None
        below = low is not None and (value < low or strict and value == low)
        above = high is not None and (value > high or strict_high and value == high)
        if not math.isfinite(value) or below or above:
            raise BadValue(f"must be {what}, got {text!r}")
        return value
    parse.__name__ = what
    return parse


def short_repr(value, limit=40):
    """``repr(value)`` cut to ``limit`` characters: a bad value in a one-line error, whatever
    its size (a damaged file's list of thousands of items).

    >>> short_repr(list(range(100)), 20)
    '[0, 1, 2, 3, 4, 5...'
    """
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def knob_value(value, kwarg, env, default, type=str):
    """``type(value)`` when keyword argument ``kwarg`` was given (not None), else
    ``env_value(env, default, type)``; an invalid value raises ValueError naming both."""
    if value is None:
        return env_value(env, default, type)
    try:
        return type(value)
    except ValueError as e:
        raise ValueError(f"{kwarg}={value!r} is not a valid value (keyword argument; "
                         f"environment twin {env}): {e}") from None


def env_value(env, default=None, type=str):
    """Return ``type(os.environ[env])``, or ``default`` when unset or empty.

    A value that does not parse raises ``ValueError`` naming the variable and the value.
    """
    raw = os.environ.get(env, "")
    if raw == "":
        return default
    try:
        if type is bool:
            return parse_bool(raw)
        return type(raw)
    except ValueError as e:
        raise ValueError(f"environment variable {env}={raw!r} is not a valid value: {e}") from None


def parse_bool(text):
    """Parse 1/0, true/false, yes/no, on/off (any case)."""
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise BadValue(f"expected one of 1/0, true/false, yes/no, on/off, got {text!r}")


def add_knob(parser, flag, env, default, help, type=str, short=None, **kwargs):
    """Add ``flag`` (and its ``short`` form, e.g. "-C") to an argparse parser (or group) with
    ``env`` as its environment twin.

    The environment value, when set, replaces ``default``; the help text ends with
    "(env: ENV, default: DEFAULT)". Booleans take an explicit value: ``--overlap 0``.
    """
    value = env_value(env, default, type)
    choices = kwargs.get("choices")
    if choices is not None and value != default and value not in choices:
        raise ValueError(f"environment variable {env}={value!r} is not one of "
                         f"{', '.join(map(str, choices))}")
    parse = parse_bool if type is bool else type
    # plain text: argparse would read "25 % label noise" as a format and print its own dict
    text = f"{help} (env: {env}, default: {default})".replace("%", "%%")
    return parser.add_argument(*filter(None, (short, flag)), type=parse, default=value,
                               help=text, **kwargs)


def check_output_path(name, path, folder=False):
    """Raise BadValue (a ValueError) unless ``path`` (a file, or a folder with ``folder``) can
    be written.

    Nothing is created: the path must be writable where it exists, else its nearest existing
    parent must be a writable folder. Call it at parse time, on every rank, so that a bad
    path fails before any work instead of losing a run's results at the end.
    """
    full = os.path.abspath(os.path.expanduser(path))
    kind = "folder" if folder else "file"
    if os.path.exists(full):
        if folder != os.path.isdir(full):
            problem = "is a file" if folder else "is a folder"
        elif not os.access(full, os.W_OK | (os.X_OK if folder else 0)):
            problem = "is not writable"
        else:
            return path
    else:
        parent, dangling = full, None
        while not os.path.exists(parent):
            if os.path.islink(parent):      # a symlink to nothing: makedirs would fail on it
                dangling = parent
            parent = os.path.dirname(parent)
        if dangling:
            problem = (f"cannot be created: {dangling} is a symlink to {os.readlink(dangling)}, "
                       f"which does not exist (create that, or remove the link)")
        elif not os.path.isdir(parent):
            problem = f"cannot be created: {parent} is a file"
        elif not os.access(parent, os.W_OK | os.X_OK):
            problem = f"cannot be created: {parent} is not writable"
        else:
            return path
    raise BadValue(f"{name} = {path!r} {problem}; choose a writable {kind}")


def writable_file(path):
    """``path`` if a file can be written there ('-': stdout), for ``type=``: checked at parse
    time, so that a bad path fails before the work whose results it would hold."""
    folder = os.path.dirname(os.path.abspath(path))
    if path != "-" and (os.path.isdir(path) or not os.path.isdir(folder)
                        or not os.access(folder, os.W_OK)):
        raise BadValue(f"cannot write {path!r}: give a file path in an existing writable folder")
    return path


def check_output_flag(parser, flag, path, folder=False):
    """``parser.error`` unless ``path`` is empty or writable (``check_output_path``)."""
    try:
        return path and check_output_path(flag, path, folder)
    except ValueError as e:
        parser.error(str(e))
