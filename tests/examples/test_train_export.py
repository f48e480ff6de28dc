"""examples/imagenet/train.py writes its final model as nnabla does (``model.h5`` by
nn.save_parameters, ``model.nnp`` by nnabla.utils.save), ``nnabla_cli infer`` runs the .nnp
and gives the logits of the trained model, and ``--init-params`` starts a run from either."""
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.examples.test_train import SMALL
from tests.mpirun import REPO, run_mpi
from tests.slowdown import scaled

PROG = "tests/examples/progs/train_check.py"
TINY = SMALL + ["--train-images", "64", "--epochs", "1", "--max-steps", "2"]


def logits_of(params_file, x):
    """The trained model's logits for ``x`` (1 image), built as validation builds it."""
    sys.path.insert(0, os.path.join(REPO, "examples", "imagenet"))
    import nnabla as nn
    from config import parse_config
    from models import get_model
    import train
    cfg = parse_config(TINY)
    nn.clear_parameters()
    classes = train.open_datasets(cfg, log=lambda text: None)[0].num_classes
    model = get_model(cfg.arch, classes, cfg.width, stride_on=cfg.stride_on,
                      zero_init_last_gamma=cfg.zero_init_last_gamma)
    image = nn.Variable.from_numpy_array(x)
    y = model(image, test=True)
    nn.load_parameters(params_file)
    y.forward()
    nn.clear_parameters()
    return y.d.copy()


@pytest.mark.slow
def test_final_model_is_nnabla_deployable(tmp_path):
    out = tmp_path / "run"
    log = run_mpi(2, [PROG] + TINY + ["--output-dir", str(out)], timeout=180)
    assert "PARAMS_EQUAL" in log and (out / "model.h5").exists() and (out / "model.nnp").exists()
    x = np.random.RandomState(0).rand(1, 3, 16, 16).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    cli = os.path.join(os.path.dirname(sys.executable), "nnabla_cli")
    subprocess.run([cli, "infer", "-c", str(out / "model.nnp"), "-o", str(tmp_path / "y"),
                    str(tmp_path / "x.bin")], check=True, capture_output=True, timeout=scaled(120))
    got = np.fromfile(tmp_path / "y_0.bin", np.float32)
    want = logits_of(str(out / "model.h5"), x).ravel()
    assert got.shape == want.shape and np.allclose(got, want, rtol=1e-5, atol=1e-5), (got, want)

    # Starting from the saved parameters: the first steps train on, and a file of another
    # model is refused on every rank with the names of what does not fit.
    for source in ("model.h5", "model.nnp"):
        again = run_mpi(2, [PROG] + TINY + ["--output-dir", str(tmp_path / source),
                                            "--init-params", str(out / source)], timeout=180)
        assert f"started from the parameters in {out / source}" in again, again
        assert "PARAMS_EQUAL" in again
    bad = run_mpi(2, [PROG] + TINY + ["--output-dir", str(tmp_path / "bad"), "--width", "0.5",
                                      "--init-params", str(out / "model.h5")],
                  timeout=180, check=False)
    assert "does not fit the model" in bad and "other shapes" in bad, bad
