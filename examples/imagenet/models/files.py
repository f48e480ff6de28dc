"""The model as nnabla users keep it: parameters in, the deployable model out.

``load_initial_parameters`` starts a run from ``nn.save_parameters``' file (.h5, .protobuf)
or a .nnp (``--init-params``); ``export_model`` writes ``model.h5`` and ``model.nnp`` at the
end of a run. Example::

    export_model(model, 224, "runs/imagenet", print)
    load_initial_parameters("runs/imagenet/model.h5", print)    # in the next run
"""
import os

import nnabla as nn


def export_model(model, image_size, output_dir, log):
    """Write the final model as nnabla users deploy it: ``model.h5`` (nn.save_parameters, BN
    statistics included) and ``model.nnp`` (nnabla.utils.save: the inference graph, batch 1,
    input ``x`` of 3 x size x size, output ``y`` = logits, executor ``runtime``: the format
    ``nnabla_cli infer -c model.nnp -o out x.bin`` and nnabla's C++ runtime read)."""
    from nnabla.utils.save import save
    nn.save_parameters(os.path.join(output_dir, "model.h5"),
                       nn.get_parameters(grad_only=False))
    x = nn.Variable((1, 3, image_size, image_size))
    y = model(x, test=True)
    save(os.path.join(output_dir, "model.nnp"), {
        "networks": [{"name": "runtime", "batch_size": 1, "outputs": {"y": y},
                      "names": {"x": x}}],
        "executors": [{"name": "runtime", "network": "runtime", "data": ["x"],
                       "output": ["y"]}]})
    log(f"model written: {output_dir}/model.h5 and model.nnp (start another run from it with "
        f"--init-params {output_dir}/model.h5)")


def load_initial_parameters(path, log):
    """Overwrite every parameter of the model (BN statistics included) with the one of the
    same name in ``path`` (.h5, .protobuf or .nnp, as nn.load_parameters reads them); a
    ValueError names the parameters missing from the file or of another shape."""
    scope = "init_params"
    with nn.parameter_scope(scope):
        nn.load_parameters(path)
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
