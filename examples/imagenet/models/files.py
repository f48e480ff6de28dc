"""The model as nnabla users keep it: parameters in, the deployable model out.

``load_initial_parameters`` starts a run from ``nn.save_parameters``' file (.h5, .protobuf)
or a .nnp (``--init-params``); ``export_model`` writes ``model.h5`` and ``model.nnp`` at the
end of a run (whole or not at all: WriteError when the disk is full). Example::

    export_model(model, 224, "runs/imagenet", print)
    load_initial_parameters("runs/imagenet/model.h5", print)    # in the next run
"""
import os

import nnabla as nn

from nnabla_torus.files import atomic_path


def export_model(model, image_size, output_dir, log):
    """Write the final model as nnabla users deploy it: ``model.h5`` (nn.save_parameters, BN
    statistics included) and ``model.nnp`` (nnabla.utils.save: the inference graph, batch 1,
    input ``x`` of 3 x size x size, output ``y`` = logits, executor ``runtime``: the format
    ``nnabla_cli infer -c model.nnp -o out x.bin`` and nnabla's C++ runtime read)."""
    from nnabla.utils.save import save
    # each through a temporary renamed over the old file: a full disk keeps the previous model
    with atomic_path(os.path.join(output_dir, "model.h5")) as temporary:
        nn.save_parameters(temporary, nn.get_parameters(grad_only=False))
    x = nn.Variable((1, 3, image_size, image_size))
    y = model(x, test=True)
    with atomic_path(os.path.join(output_dir, "model.nnp")) as temporary:
        save(temporary, {
            "networks": [{"name": "runtime", "batch_size": 1, "outputs": {"y": y},
                          "names": {"x": x}}],
            "executors": [{"name": "runtime", "network": "runtime", "data": ["x"],
                           "output": ["y"]}]})
    log(f"model written: {output_dir}/model.h5 and model.nnp (start another run from it with "
        f"--init-params {output_dir}/model.h5)")


# nnabla's parameter readers by file suffix; ".hdf5" is HDF5 too (nnabla skips it silently:
# "is omitted", nnabla/utils/get_file_handle.py).
PARAMETER_READERS = {".h5": ".h5", ".hdf5": ".h5", ".protobuf": ".protobuf", ".nnp": ".nnp"}


def read_parameter_file(path):
    """``nn.load_parameters(path)`` into the current scope; a ValueError naming the file and
    the fix for a suffix nnabla cannot read or a file that is not what its suffix says
    (truncated, garbage, an HDF5 file without nnabla's parameter attributes)."""
    suffix = os.path.splitext(path)[1].lower()
    reader = PARAMETER_READERS.get(suffix)
    if reader is None:
        raise ValueError(f"--init-params {path}: nnabla reads parameters from .h5 (.hdf5), "
                         f".protobuf or .nnp files, not {suffix or 'a name without a suffix'}; "
                         f"give one of those (an earlier run's model.h5)")
    try:
        with open(path, "rb") as f:
            nn.load_parameters(f if reader != suffix else path, extension=reader)
    except Exception as error:   # h5py, zipfile and protobuf each raise their own kind
        why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        raise ValueError(f"--init-params {path} is not a readable {suffix} parameter file "
                         f"({why.rstrip(': ')}); give a model.h5 or model.nnp that nnabla "
                         f"wrote (an earlier run's, or nn.save_parameters')") from None


def load_initial_parameters(path, log):
    """Overwrite every parameter of the model (BN statistics included) with the one of the
    same name in ``path`` (.h5, .protobuf or .nnp, as nn.load_parameters reads them); a
    ValueError names the parameters missing from the file or of another shape."""
    scope = "init_params"
    with nn.parameter_scope(scope):
        read_parameter_file(path)
        loaded = nn.get_parameters(grad_only=False)
    model = {k: v for k, v in nn.get_parameters(grad_only=False).items()
             if not k.startswith(scope + "/")}
    missing = [k for k in model if k not in loaded]
    shapes = [f"{k} {tuple(loaded[k].shape)} (model {tuple(v.shape)})"
              for k, v in model.items() if k in loaded and loaded[k].shape != v.shape]
    problems = []
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        problems.append(f"missing {', '.join(missing[:5])}{more}")
    if shapes:
        problems.append(f"other shapes: {', '.join(shapes[:5])}")
    if problems:
        raise ValueError(f"--init-params {path} does not fit the model: {'; '.join(problems)} "
                         f"(use a file saved with the same --arch, --width and classes)")
    for name, variable in model.items():
        variable.d = loaded[name].d
    with nn.parameter_scope(scope):
        nn.clear_parameters()
    log(f"started from the parameters in {path} ({len(model)} arrays)")
