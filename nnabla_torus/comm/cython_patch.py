"""Replace an attribute of one of nnabla's Cython classes (``Variable``, ``Function``).

Their types refuse ``setattr`` (built-in types), so the replacement goes into the type's own
dictionary, reached through ``gc.get_referents`` of its read-only proxy, and
``PyType_Modified`` clears CPython's method cache. CPython only; callers fall back when it
raises. Used for ``Variable.backward`` (:mod:`.backward_callback`) and for ``Function.name``,
``recompute`` and ``_proto_call`` (:mod:`.sync_bn`).
"""
import ctypes
import gc


def replace(cls, name, value):
    """Make ``value`` the attribute ``name`` of ``cls``; return the attribute it replaces."""
    namespace = gc.get_referents(cls.__dict__)[0]
    original = namespace[name]
    namespace[name] = value
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(cls))
    return original
