"""Dataclasses with slots on every Python the example supports (3.8-3.10).

``dataclasses.dataclass(slots=True)`` is new in Python 3.10; :func:`slotted` gives a dataclass
the same ``__slots__`` on 3.8 and 3.9, so that assigning a field that does not exist raises
AttributeError instead of adding an attribute nobody reads. Example::

    @slotted
    @dataclasses.dataclass
    class Progress:
        step: int = 0

    Progress().stpe = 2          # AttributeError: 'Progress' object has no attribute 'stpe'
"""
import dataclasses


def slotted(cls):
    """``cls``, a dataclass, rebuilt with ``__slots__`` naming its fields (what Python 3.10's
    ``dataclass(slots=True)`` does: a class's slots are fixed when it is created)."""
    names = tuple(field.name for field in dataclasses.fields(cls))
    # the fields' defaults are class attributes, which would shadow the slots; __init__
    # already holds them
    namespace = {key: value for key, value in cls.__dict__.items()
                 if key not in (*names, "__dict__", "__weakref__")}
    namespace["__slots__"] = names
    return type(cls)(cls.__name__, cls.__bases__, namespace)
