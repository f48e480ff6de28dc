"""make gpu-check's end-to-end case (tools/gpu_check_cases.py) run here, on the fake NCCL, with
the same argv builder and output check as on GPUs: train.py --algorithm planned in two
launches (validation, checkpoints, resume) on the embedded digits and on a JPEG folder; the
fake's device rule stands in for nvidia-smi's watch (a rank touching another GPU fails)."""
import os
import sys

import pytest

from tests.mpirun import REPO

sys.path.insert(0, os.path.join(REPO, "tools"))
import gpu_check  # noqa: E402
import gpu_check_cases as cases  # noqa: E402

RANKS = 8                  # a DGX's: the sizes gpu-check derives from the rank count
STEPS, PER_EPOCH = 32, 8   # gpu-check: 40, 10; the overlap trial needs 14 steps a launch


def fake_env(tmp_path):
    return dict(os.environ, PYTHONPATH=REPO, NNABLA_TORUS_BACKEND="fake-nccl",
                NNABLA_TORUS_CACHE_DIR=str(tmp_path / "cache"))


@pytest.mark.slow
@pytest.mark.parametrize("data", ["digits", "jpeg"])
def test_the_end_to_end_case_passes_on_the_fake(tmp_path, data):
    data_dir = (cases.write_jpeg_folder(str(tmp_path / "jpegs"),
                                        cases.e2e_train_images(RANKS, PER_EPOCH))
                if data == "jpeg" else "")
    small = ["--arch", "resnet18", "--width", "0.125"]    # a JPEG folder's recipe: ResNet-50
    runs = cases.e2e_cases(RANKS, "cpu", str(tmp_path), data_dir, steps=STEPS,
                           steps_per_epoch=PER_EPOCH, extra=small if data_dir else ())
    assert [r.argv[r.argv.index("--max-steps") + 1] for r in runs] == ["16", "32"]
    for case in runs:
        done = gpu_check.run(case.argv, fake_env(tmp_path), 600)
        detail = case.check(done.stdout, done.returncode)
        print(f"{case.name}: {detail}")
        assert detail.startswith(f"{case.argv[case.argv.index('--max-steps') + 1]} steps"), detail


def test_the_jpeg_folder_holds_every_step_of_the_end_to_end_case(tmp_path):
    """At 8 ranks a folder of 192 images made 3 steps an epoch: the run ended at step 15,
    not 20. The folder is sized from the rank count, and rewritten for another count."""
    root = str(tmp_path / "jpegs")
    for ranks in (2, 8):
        images = cases.e2e_train_images(ranks)
        cases.write_jpeg_folder(root, images)
        train = cases.jpeg_count(os.path.join(root, "train"))
        assert train == images == cases.STEPS_PER_EPOCH * cases.LOCAL_BATCH * ranks
        argv = cases.e2e_cases(ranks, "cudnn", str(tmp_path), root)[0].argv
        assert argv[argv.index("--train-images") + 1] == str(images)
        assert int(argv[argv.index("--epochs") + 1]) * cases.STEPS_PER_EPOCH > cases.E2E_STEPS


def test_the_end_to_end_check_refuses_what_it_should():
    ok = ("val top-1 0.1 top-5 0.5\n  checkpoint:  /x/ckpt.npz.chk\nresumed from /x: step 20\n"
          '{"val_top1": 0.1, "steps": 40, "in_use": {"algorithm": "native"}}\n')
    assert "no overlap trial (planner's algorithm: native)" in cases.check_train(ok, 0, 40, True)
    for out, code, why in [(ok, 1, "exit 1"), (ok.replace("val top-1", "v"), 0, "validation"),
                           (ok.replace("resumed", "r"), 0, "resumed from"),
                           (ok + "RuntimeError: fake device rule: ...", 0, "another GPU"),
                           (ok + "; timing both on this run next", 0, "0 decisions")]:
        with pytest.raises(cases.CaseFailed, match=why):
            cases.check_train(out, code, 40, True)
    cases.check_train(ok, 0, 40, True, native=True)      # on GPUs: one host runs native
    with pytest.raises(cases.CaseFailed, match="left nnabla's own path"):
        cases.check_train(ok.replace('"native"', '"torus2d"'), 0, 40, True, native=True)
