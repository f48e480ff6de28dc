"""A user's own model for the planner, read from an nnabla ``.nnp`` file or built by a Python
function, and its cost counted from the graph (:func:`.model_cost.count_cost`).

* ``.nnp`` (``nnabla.utils.save.save``): nnabla's ``NnpLoader`` builds the network at batch 1;
  every output of the network is counted, with the parameters the file marks as trained.
* a function ``MODULE:FUNCTION`` or ``FILE.py:FUNCTION``: ``FUNCTION(batch_size)`` builds the
  training graph for ``batch_size`` images and returns its loss (or output) Variable, or a
  list of them. It is called at batch 1 and 2, each time in a parameter scope of its own
  (its parametric functions' parameters are the trained ones): a graph whose cost does not
  double ignores its ``batch_size``.

Every error is one ValueError line naming the file or function and the fix. Example::

    >>> import nnabla as nn, nnabla.parametric_functions as PF
    >>> def build(batch_size):
    ...     with nn.parameter_scope("model_source_example"):
    ...         return PF.affine(nn.Variable((batch_size, 3, 4, 4)), 10)
    >>> function_cost(build).forward_macs, len(function_cost(build).param_shapes)
    (480, 2)
"""
import importlib
import importlib.util
import os
import sys
import traceback
from collections import OrderedDict

from .model_cost import count_cost


def _nnabla():
    """nnabla and its functions, imported on first use (planning imports without nnabla)."""
    import nnabla
    import nnabla.functions
    return nnabla, nnabla.functions


def _one_output(outputs):
    """A Variable whose graph holds every Variable of ``outputs`` (F.sink over several)."""
    _, F = _nnabla()
    return outputs[0] if len(outputs) == 1 else F.sink(*outputs)


def _where(error):
    """`` at file:line`` of the innermost frame of ``error``'s traceback in the user's code
    ('' when it was raised in this module or Python's import machinery)."""
    ours = (os.path.abspath(__file__), os.path.dirname(importlib.__file__))
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith("<") and not f.filename.startswith(ours)]
    return f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def nnp_cost(path, network=None):
    """(model name, ModelCost) of ``network`` in the .nnp file ``path`` (None: its only network).
    The name is the file's name (``digits.nnp``)."""
    if not os.path.isfile(path):
        raise ValueError(f"--nnp {path}: no such file; give a .nnp file written by "
                         f"nnabla.utils.save.save")
    from nnabla.utils.nnp_graph import NnpLoader
    try:
        loader = NnpLoader(path)
    except Exception as e:   # nnabla's reader raises what its parsers raise (zip, protobuf, ...)
        raise ValueError(f"--nnp {path}: not an nnabla .nnp file ({type(e).__name__}: "
                         f"{' '.join(str(e).split()) or 'unreadable'}); write it with "
                         f"nnabla.utils.save.save") from None
    names = loader.get_network_names()
    if not names:
        raise ValueError(f"--nnp {path}: no network in it, not an nnabla .nnp file; write it "
                         f"with nnabla.utils.save.save")
    if network is None and len(names) != 1:
        raise ValueError(f"--nnp {path} holds {len(names)} networks {names}: name the one to "
                         f"plan with --nnp-network")
    name = names[0] if network is None else network
    if name not in names:
        raise ValueError(f"--nnp-network {name!r} is not in {path}; it holds {names}")
    nn, _ = _nnabla()
    try:
        with nn.parameter_scope("", OrderedDict()):   # nnabla publishes them: not globally
            net = loader.get_network(name, batch_size=1)
    except Exception as e:   # a network nnabla cannot build: its error, on one line
        raise ValueError(f"--nnp {path}: nnabla cannot build network {name!r} "
                         f"({type(e).__name__}: {' '.join(str(e).split())})") from None
    if not net.outputs:
        raise ValueError(f"--nnp {path}: network {name!r} has no outputs to count")
    trained = [p.variable_instance for p in net.proto_network.parameters.values()
               if p.variable_instance is not None and p.variable_instance.need_grad]
    return os.path.basename(path), count_cost(_one_output(list(net.outputs.values())), trained,
                                              batch=1)


def load_function(spec):
    """The function ``MODULE:FUNCTION`` (imported; the current folder first, as ``python -m``)
    or ``FILE.py:FUNCTION`` (run from its file)."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise ValueError(f"--model-fn {spec!r}: expected MODULE:FUNCTION or FILE.py:FUNCTION "
                         f"(e.g. mymodels.digits:build or ./digits.py:build)")
    if where.endswith(".py") and not os.path.isfile(where):
        raise ValueError(f"--model-fn {spec}: no such file {where}")
    try:
        if where.endswith(".py"):
            found = importlib.util.spec_from_file_location(
                os.path.splitext(os.path.basename(where))[0], where)
            module = importlib.util.module_from_spec(found)
            found.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            try:
                module = importlib.import_module(where)
            finally:
                sys.path.remove(os.getcwd())
    except Exception as e:   # the user's module runs: any error of it is reported, one line
        raise ValueError(f"--model-fn {spec}: importing {where} raised {type(e).__name__}: "
                         f"{' '.join(str(e).split())}{_where(e)}") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise ValueError(f"--model-fn {spec}: {where} has no function {attr!r}")
    return function


def _built_cost(function, spec, batch):
    """count_cost of the graph ``function(batch)`` returns, over all its ``batch`` images;
    ValueError naming ``spec``."""
    nn, _ = _nnabla()
    call = f"{getattr(function, '__name__', 'the function')}(batch_size={batch})"
    try:
        with nn.parameter_scope("", OrderedDict()):   # its own parameters, none of another's
            built = function(batch)
            trained = list(nn.get_parameters(grad_only=True).values())
    except Exception as e:   # the user's function runs: its error, one line, where it was raised
        raise ValueError(f"--model-fn {spec}: {call} raised {type(e).__name__}: "
                         f"{' '.join(str(e).split())}{_where(e)}; fix the function") from None
    outputs = list(built) if isinstance(built, (list, tuple)) else [built]
    if not outputs or not all(isinstance(v, nn.Variable) for v in outputs):
        raise ValueError(f"--model-fn {spec}: {call} returned {type(built).__name__}, not an "
                         f"nnabla Variable: return the loss (or output) Variable of the graph")
    return count_cost(_one_output(outputs), trained, batch=1)


def function_cost(function, spec=None):
    """ModelCost of the graph ``function(batch_size)`` builds (module doc); ValueError naming
    ``spec`` (the --model-fn value) when it raises, returns no Variable or ignores its
    ``batch_size``."""
    spec = spec or getattr(function, "__name__", "the function")
    one, two = _built_cost(function, spec, 1), _built_cost(function, spec, 2)   # whole graphs
    if one.forward_macs and two.forward_macs != 2 * one.forward_macs:
        raise ValueError(f"--model-fn {spec}: its graph costs {one.forward_macs:,} multiply-adds "
                         f"at batch_size=1 and {two.forward_macs:,} at 2, not twice as many: "
                         f"build the inputs with the batch_size the function is given")
    return one


def own_model_cost(nnp=None, network=None, model_fn=None):
    """(model name, ModelCost) from ``--nnp`` (and ``--nnp-network``) or ``--model-fn``; (None,
    None) when neither is given. ValueError when the graph has nothing this counter counts."""
    if nnp is None and model_fn is None:
        return None, None
    if nnp is not None:
        name, cost = nnp_cost(nnp, network)
    else:
        name, cost = model_fn, function_cost(load_function(model_fn), model_fn)
    if not cost.forward_macs:
        raise ValueError(f"model {name}: its graph has no convolution, Affine or BatchMatmul "
                         f"to count FLOPs from; give --model NAME --gflops-per-image G --params P")
    return name, cost
