"""Knobs: every setting is a CLI flag with an environment-variable twin and a documented default.

Precedence is CLI > environment > default (a config file, where a tool has one, sits between
CLI and environment). Example::

    parser = argparse.ArgumentParser()
    add_knob(parser, "--grid", env="NNABLA_TORUS_GRID", default=None,
             help="process grid XxY for torus2d")
    args = parser.parse_args()   # --grid 2x4, or NNABLA_TORUS_GRID=2x4, or None
"""
import os


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
    raise ValueError(f"expected one of 1/0, true/false, yes/no, on/off, got {text!r}")


def add_knob(parser, flag, env, default, help, type=str, **kwargs):
    """Add ``flag`` to an argparse parser (or group) with ``env`` as its environment twin.

    The environment value, when set, replaces ``default``; the help text ends with
    "(env: ENV, default: DEFAULT)". Booleans take an explicit value: ``--overlap 0``.
    """
    value = env_value(env, default, type)
    choices = kwargs.get("choices")
    if choices is not None and value != default and value not in choices:
        raise ValueError(f"environment variable {env}={value!r} is not one of "
                         f"{', '.join(map(str, choices))}")
    parse = parse_bool if type is bool else type
    return parser.add_argument(flag, type=parse, default=value,
                               help=f"{help} (env: {env}, default: {default})", **kwargs)
