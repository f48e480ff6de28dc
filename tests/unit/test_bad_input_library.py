"""Every knob of the communicator and every flag of the planner CLI, with its bad values: each
is refused with a message naming the knob and its allowed range (no hang, no traceback, no
silent default). One table per entry point; a row is (value(s), expected message fragment).
"""
import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from nnabla_torus.cli import plan as plan_cli
from nnabla_torus.planning.machine_profile import PROFILE_DIR, load_profile
from nnabla_torus.planning.schedules import BatchSchedule
from tests.slowdown import scaled

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# -- the communicator: environment variable (or keyword argument), value, message -----------
COMMUNICATOR = [
    ("NNABLA_TORUS_TIMEOUT", "0", "NNABLA_TORUS_TIMEOUT='0' is not a valid value: must be a "
                                  "finite number > 0 and <= 2.14748e+06 (seconds, e.g. 300; "
                                  "86400 for a day)"),
    # Values the runtime cannot honour (before: accepted, then OverflowError in the watchdog
    # thread, or every wait stalled): bounded by the longest timeout nnabla's watchdog counts.
    ("NNABLA_TORUS_TIMEOUT", "1e10", "must be a finite number > 0 and <= 2.14748e+06"),
    ("NNABLA_TORUS_TIMEOUT", "-1", "must be a finite number > 0"),
    ("NNABLA_TORUS_TIMEOUT", "nan", "must be a finite number > 0"),
    ("NNABLA_TORUS_TIMEOUT", "inf", "must be a finite number > 0"),
    ("NNABLA_TORUS_TIMEOUT", "5min", "must be a finite number > 0"),
    ("NNABLA_TORUS_SEGMENT_BYTES", "0", "NNABLA_TORUS_SEGMENT_BYTES='0' is not a valid value: "
                                        "must be an integer >= 1 (bytes per ring message"),
    ("NNABLA_TORUS_SEGMENT_BYTES", "1.5", "must be an integer >= 1"),
    ("NNABLA_TORUS_PIPELINE_BYTES", "-1", "NNABLA_TORUS_PIPELINE_BYTES='-1' is not a valid value: "
                                          "must be an integer >= 0 (bytes per torus piece; 0: no "
                                          "pieces)"),
    ("NNABLA_TORUS_SPIN_S", "-0.1", "NNABLA_TORUS_SPIN_S='-0.1' is not a valid value: must be a "
                                    "finite number >= 0 (seconds"),
    ("NNABLA_TORUS_SPIN_S", "inf", "must be a finite number >= 0"),
    ("NNABLA_TORUS_POLL_SLEEP_S", "nan", "NNABLA_TORUS_POLL_SLEEP_S='nan' is not a valid value: "
                                         "must be a finite number >= 0"),
    ("NNABLA_TORUS_POLL_SLEEP_S", "1e300", "must be a finite number >= 0 and <= 0.01 (seconds a "
                                           "waiting rank sleeps per poll"),
    ("NNABLA_TORUS_POLL_SLEEP_S", "10", "must be a finite number >= 0 and <= 0.01"),
    ("poll_sleep", 1.0, "poll_sleep=1.0 is not a valid value (keyword argument; environment twin "
                        "NNABLA_TORUS_POLL_SLEEP_S)"),
    ("NNABLA_TORUS_RANKS_PER_HOST", "0", "NNABLA_TORUS_RANKS_PER_HOST='0' is not a valid value: "
                                         "must be an integer >= 1 (ranks per host; unset it to "
                                         "group ranks by host name)"),
    ("NNABLA_TORUS_RANKS_PER_HOST", "two", "must be an integer >= 1"),
    ("NNABLA_TORUS_ALGORITHM", "tree", "unknown all-reduce algorithm 'tree'; choose one of "
                                       "torus2d, ring, hierarchical, native, auto"),
    ("NNABLA_TORUS_AUTO_PROFILE", "nosuch", "no profile file or shipped profile 'nosuch'"),
    ("NNABLA_TORUS_SHM", "maybe", "NNABLA_TORUS_SHM='maybe' is not a valid value: expected one "
                                  "of 1/0, true/false"),
    ("NNABLA_TORUS_BIND_GPU_NUMA", "maybe", "NNABLA_TORUS_BIND_GPU_NUMA='maybe' is not a valid "
                                            "value: expected one of 1/0, true/false"),
    ("NNABLA_TORUS_SHM_BYTES", "0", "NNABLA_TORUS_SHM_BYTES='0' is not a valid value: must be an "
                                    "integer >= 1 (bytes per member and shared piece"),
    ("shm_bytes", -1, "shm_bytes=-1 is not a valid value (keyword argument; environment twin "
                      "NNABLA_TORUS_SHM_BYTES): must be an integer >= 1"),
    ("shm", "maybe", "shm='maybe' is not a valid value"),
    ("NNABLA_TORUS_BACKEND", "gloo", "unknown backend 'gloo'; choose one of mpi, nccl, fake-nccl"),
    ("NNABLA_TORUS_GRID", "2by2", "grid '2by2' is not of the form XxY with positive integers"),
    ("NNABLA_TORUS_GRID", "0x4", "grid '0x4' is not of the form XxY with positive integers"),
    ("NNABLA_TORUS_WIRE_FP16", "maybe", "NNABLA_TORUS_WIRE_FP16='maybe' is not a valid value: "
                                        "expected one of 1/0, true/false"),
    ("NNABLA_TORUS_CHECK", "2", "NNABLA_TORUS_CHECK='2' is not a valid value"),
    ("timeout", 0, "timeout=0 is not a valid value (keyword argument; environment twin "
                   "NNABLA_TORUS_TIMEOUT): must be a finite number > 0"),
    ("timeout", math.nan, "timeout=nan is not a valid value"),
    ("segment_bytes", 0, "segment_bytes=0 is not a valid value (keyword argument; environment "
                         "twin NNABLA_TORUS_SEGMENT_BYTES): must be an integer >= 1"),
    ("pipeline_bytes", -8, "pipeline_bytes=-8 is not a valid value"),
    ("algorithm", "tree", "unknown all-reduce algorithm 'tree'"),
    ("backend", "gloo", "unknown backend 'gloo'"),
    ("grid", "2x", "grid '2x' is not of the form XxY"),
]


def make_communicator(name, value):
    from nnabla_torus.comm.settings import mpi_settings as settings
    from nnabla_torus.comm.communicator import TorusCommunicator
    if name in ("segment_bytes", "pipeline_bytes", "shm", "shm_bytes", "poll_sleep"):  # MPI kwargs
        return settings(**{name: value})
    if name.isupper():
        return TorusCommunicator()
    return TorusCommunicator(**{name: value})


@pytest.mark.parametrize("name, value, message", COMMUNICATOR,
                         ids=[f"{n}={v}" for n, v, _ in COMMUNICATOR])
def test_communicator_knobs(monkeypatch, name, value, message):
    if name.isupper():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as error:
        make_communicator(name, value)
    assert message in str(error.value)


# -- the planner CLI: arguments, message (argparse's "error: argument --flag: ..." or ours) ---
PLAN = [
    ("--max-gpus 0", "argument --max-gpus: must be an integer >= 1, got '0'"),
    ("--max-gpus -4", "argument --max-gpus: must be an integer >= 1"),
    ("--max-gpus 1e6", "argument --max-gpus: must be an integer >= 1, got '1e6'"),
    ("--max-gpus 1000000", "1000000 GPUs is more than the 4352 GPUs of profile 'abci' (1088 "
                           "hosts x 4): plan at most 4352, pass --allow-beyond-profile"),
    ("--max-gpus 1000000 --allow-beyond-profile", "plan at most 69632 GPUs (16x the profile)"),
    ("--gpus 0", "argument --gpus: must be an integer >= 1 (GPU counts, e.g. 1,4,8), got '0'"),
    ("--gpus 4,x", "argument --gpus: must be an integer >= 1 (GPU counts, e.g. 1,4,8), got 'x'"),
    ("--gpus 8,5000", "5000 GPUs is more than the 4352 GPUs of profile 'abci'"),
    ("--allow-beyond-profile maybe", "argument --allow-beyond-profile: expected one of 1/0, "
                                     "true/false, yes/no, on/off, got 'maybe'"),
    ("--batch 0", "argument --batch: must be an integer >= 1, got '0'"),
    ("--batch -5", "argument --batch: must be an integer >= 1, got '-5'"),
    ("--local-batch 0", "argument --local-batch: must be an integer >= 1, got '0'"),
    ("--local-batch 0 --schedule 0:256", "argument --local-batch: must be an integer >= 1"),
    ("--schedule 0:256", "--schedule needs --local-batch"),
    ("--schedule 0:64,5:128,3:256 --local-batch 32", "argument --schedule: batch schedule "
                                                     "0:64,5:128,3:256: epochs must increase "
                                                     "strictly"),
    ("--schedule nan:128 --local-batch 32", "batch schedule nan:128 must start at epoch 0"),
    ("--schedule 0:64,nan:128 --local-batch 32", "epochs must be finite"),
    ("--schedule 0:0 --local-batch 1", "every global batch must be >= 1"),
    ("--schedule 0:64,5:x --local-batch 32", "batch schedule item '5:x' is not 'epoch:batch'"),
    ("--schedule 0:100 --local-batch 32", "schedule batch 100 at epoch 0 is not a multiple of the "
                                          "per-GPU batch 32"),
    ("--noise-scale -1", "argument --noise-scale: must be a finite number > 0, got '-1'"),
    ("--noise-scale 0", "argument --noise-scale: must be a finite number > 0"),
    ("--base-batch 0", "argument --base-batch: must be an integer >= 1"),
    ("--dataset-size -3", "argument --dataset-size: must be an integer >= 1 and <= "
                          "1000000000000, got '-3'"),
    ("--epochs -1", "argument --epochs: must be a finite number > 0 and <= 100000, got '-1'"),
    ("--epochs nan", "argument --epochs: must be a finite number > 0"),
    ("--min-efficiency 2", "argument --min-efficiency: must be a finite number >= 0 and <= 1"),
    ("--gpus 64 --min-efficiency 0.9999", "no plan reaches scaling efficiency 0.9999"),
    ("--algorithms ring,tree", "unknown algorithm(s) ['tree']"),
    ("--rows some", "argument --rows: invalid choice: 'some'"),
    ("--profile nosuch", "no profile file or shipped profile 'nosuch'"),
    ("--profile /tmp", "profile '/tmp': cannot read /tmp: Is a directory; give a profile file "
                       "(YAML or JSON) or a shipped name"),     # before: IsADirectoryError
    ("--model vgg", "profile 'abci' has no model 'vgg'"),
    ("--model vgg --gflops-per-image 15", "give --gflops-per-image and --params to price it"),
    ("--model vgg --gflops-per-image 0", "argument --gflops-per-image: must be a finite number "
                                         "> 0 and <= 1e+06, got '0'"),
    ("--model vgg --params 0", "argument --params: must be an integer >= 1 and <= "
                               "1000000000000, got '0'"),
    ("--gflops-per-image 15 --params 100", "profile 'abci' has model 'resnet50' calibrated"),
    # issue 65: sizes are bounded (before: 1e308 printed times of 400 digits)
    ("--model vgg --gflops-per-image 1e308 --params 100", "argument --gflops-per-image: must be "
                                                          "a finite number > 0 and <= 1e+06"),
    ("--model vgg --gflops-per-image 15 --params 1e13", "argument --params: must be an integer "
                                                        ">= 1 and <= 1000000000000"),
    ("--model vgg --gflops-per-image 15 --params 100 --param-arrays 0", "argument "
                                                                       "--param-arrays: must "
                                                                       "be an integer >= 1"),
    ("--param-arrays 8", "--param-arrays has no effect without --params"),
    # issue 64: a model of the user's own, never ImageNet's data
    ("--model vgg --gflops-per-image 15 --params 100", "model vgg: give --dataset-size "
                                                       "(training images per epoch)"),
    ("--nnp /nonexistent/m.nnp --dataset-size 100", "--nnp /nonexistent/m.nnp: no such file"),
    ("--nnp m.nnp --model-fn m:f", "--nnp has no effect with --model-fn"),
    ("--nnp m.nnp --recipe sony-224s", "--nnp has no effect with --recipe"),
    ("--nnp-network training", "--nnp-network has no effect without --nnp"),
    ("--model-fn build", "--model-fn 'build': expected MODULE:FUNCTION or FILE.py:FUNCTION"),
    ("--model-fn m:f --model vgg", "--model has no effect with --model-fn"),
    ("--val-images 0", "argument --val-images: must be an integer >= 1"),
    ("--validate-every 2", "--validate-every has no effect without --val-images"),
    ("--val-images 100 --validate-every 0", "argument --validate-every: must be a finite number "
                                            "> 0"),
    ("--loader-rate 0", "argument --loader-rate: must be a finite number > 0"),
    ("--startup-s 1e300", "argument --startup-s: must be a finite number >= 0 and <= 1e+06"),
    # the cluster's shape from flags (before: copy abci.yaml and edit it)
    # (0 is the profile's value in every tool since issue 50, as in train.py; bounded above)
    ("--hosts 16385", "argument --hosts: must be an integer >= 0 and <= 16384, got '16385'"),
    ("--gpus-per-host x", "argument --gpus-per-host: must be an integer >= 0 and <= 64, got "
                          "'x'"),
    ("--inter-bandwidth -1", "argument --inter-bandwidth: must be a finite number >= 0 and <= "
                             "10000"),
    ("--inter-bandwidth 1e-300", "argument --inter-bandwidth: must be 0 (the profile's) or a "
                                 "number from 0.01 to 10000 GB/s, got '1e-300'"),
    ("--gpu-model p100", "argument --gpu-model: invalid choice: 'p100'"),
    ("--hosts 2 --max-gpus 100", "100 GPUs is more than the 8 GPUs of profile 'abci' (2 hosts "
                                 "x 4)"),
    ("--json /nonexistent/plan.json", "argument --json: cannot write '/nonexistent/plan.json': "
                                      "give a file path in an existing writable folder"),
    ("--plot /tmp", "argument --plot: cannot write '/tmp'"),
    ("--explain perhaps", "argument --explain: expected one of 1/0, true/false, yes/no, on/off, "
                          "got 'perhaps'"),
    ("--recipe nope", "recipe 'nope' not found"),
    ("--fit-recipe sony-224s", "--fit-recipe needs --recipe"),
    ("--recipe sony-122s --fit-recipe digits-cpu", "--fit-recipe digits-cpu states no published "
                                                    "expected.time_s"),
    ("--simulate -1", "argument --simulate: must be an integer >= 0, got '-1'"),
    ("--max-wall 0", "argument --max-wall: must be a finite number > 0 and <= 2.14748e+06, got "
                     "'0'"),
    ("--max-wall 1e300", "argument --max-wall: must be a finite number > 0 and <= 2.14748e+06"),
    ("--sim-engine ns3", "argument --sim-engine: invalid choice: 'ns3'"),
    # A batch no candidate splits is refused with the nearest ones (before: 4,312 GPUs at
    # global batch 4,312 for --batch 63, 36,720 for 34,817; --local-batch ignored).
    ("--batch 63", "global batch 63 cannot be split as GPUs x per-GPU batch x accumulation "
                   "steps over the candidates (GPU counts 1..4352 (1091 values), per-GPU "
                   "batches 1..256 (9 values) (at most 256), accumulation steps 1,2,4,8); the "
                   "nearest feasible global batches are 60 and 64: ask for one of them, or "
                   "pass --nearest-batch"),
    ("--batch 34817", "the nearest feasible global batches are 34816 and 34880"),
    ("--batch 1000 --local-batch 32", "per-GPU batches 32 (at most 256)"),
    ("--nearest-batch maybe", "argument --nearest-batch: expected one of 1/0"),
    # Flags that another overrides are refused, not ignored (before: all accepted).
    ("--gpus 8,16 --max-gpus 4", "--max-gpus has no effect with --gpus"),
    ("--schedule 0:256 --local-batch 32 --batch 512", "--batch has no effect with --schedule "
                                                      "(the schedule sets the global batch"),
    ("--schedule 0:256 --local-batch 32 --max-gpus 64", "--max-gpus has no effect with "
                                                        "--schedule"),
    ("--schedule 0:256 --local-batch 32 --gpus 8", "--gpus has no effect with --schedule"),
    ("--schedule 0:256 --local-batch 32 --nearest-batch", "--nearest-batch has no effect with "
                                                          "--schedule"),
    ("--schedule 0:256 --local-batch 32 --plot /tmp/p.png", "--plot has no effect with "
                                                            "--schedule"),
    ("--schedule 0:256 --local-batch 32 --rows all", "--rows has no effect with --schedule"),
    ("--max-wall 5", "--max-wall has no effect without --simulate"),
    ("--sim-engine flow", "--sim-engine has no effect without --simulate"),
    ("--recipe sony-224s --explain", "--explain has no effect with --recipe"),
    ("--recipe sony-224s --batch 64", "--batch has no effect with --recipe"),
    # --allow-beyond-profile holds --gpus to its documented cap too (before: 99,999,999 planned)
    ("--gpus 99999999 --allow-beyond-profile", "99999999 GPUs is more than the 4352 GPUs of "
                                               "profile 'abci' (1088 hosts x 4): plan at most "
                                               "69632 GPUs (16x the profile)"),
]


@pytest.mark.parametrize("argv, message", PLAN, ids=[a for a, _ in PLAN])
def test_plan_cli_flags(capsys, argv, message):
    with pytest.raises(SystemExit) as ended:
        plan_cli.main(argv.split())
    text = f"{ended.value.code}\n{capsys.readouterr().err}"
    assert ended.value.code not in (0, None) and message in text, text


def test_the_table_covers_every_flag_and_knob():
    flags = {o for a in plan_cli.build_parser()._actions for o in a.option_strings}
    flags -= {"-h", "--help"}
    assert flags == {word for argv, _ in PLAN for word in argv.split() if word.startswith("--")}
    from nnabla_torus.comm.settings import KNOBS
    # any folder is accepted: one that cannot be used warns at init() and auto measures
    read = {knob.env for knob in KNOBS.values()} - {"NNABLA_TORUS_CACHE_DIR"}
    assert read == {name for name, _, _ in COMMUNICATOR if name.isupper()}


def test_nearest_batch_plans_the_nearest_feasible_batch_and_says_so(capsys, tmp_path):
    plan_cli.main(["--batch", "63", "--nearest-batch", "--json", str(tmp_path / "plan.json")])
    report = json.loads((tmp_path / "plan.json").read_text())
    out = capsys.readouterr().out
    assert ("# --batch 63 cannot be split over these candidates: planned the nearest feasible "
            "global batch 64 instead (--nearest-batch)") in out, out
    assert report["recommendation"]["global_batch"] == 64
    assert (report["batch_asked"], report["batch_planned"]) == (63, 64)


def test_split_batch_gives_the_closest_split():
    from nnabla_torus.planning.splits import split_batch
    assert split_batch(128, 3, 32) == (21, 2)      # 126 (before: 22 x 2 = 132)
    assert split_batch(1000, 3, 64) == (56, 6)     # 1,008: 55 x 6 = 990 is farther


def test_plan_cli_environment_twins_are_checked_too(monkeypatch):
    monkeypatch.setenv("NNABLA_TORUS_PLAN_BATCH", "0")
    with pytest.raises(ValueError, match=r"NNABLA_TORUS_PLAN_BATCH='0' is not a valid value: must "
                                         r"be an integer >= 1"):
        plan_cli.build_parser()


def test_a_schedule_is_kept_in_the_order_given():
    assert BatchSchedule.parse("0:34K,5:68K").phases == [(0.0, 34816), (5.0, 69632)]


# -- profile files: a bad value names the file, the key and the allowed range ---------------
PROFILE = [
    ("models.resnet50.max_local_batch", 0, "models.resnet50.max_local_batch: 0 must be an "
                                           "integer >= 1"),
    ("models.resnet50.b_ms", "fast", "models.resnet50.b_ms: 'fast' must be a number > 0"),
    ("models.resnet50.gamma", 0.5, "models.resnet50.gamma: 0.5 must be a number >= 1"),
    ("models.resnet50.grad_bytes", None, "models.resnet50.grad_bytes: None must be an integer "
                                         ">= 1"),
    ("models", None, "profile models: expected a mapping of keys to values, got None"),
    ("models", {}, "profile models: needs at least one model"),
    ("hosts", 0, "top level.hosts: 0 must be an integer >= 1"),
    ("gpus_per_host", "", "top level.gpus_per_host: '' must be an integer >= 1"),
    ("links.inter.bandwidth_GBps", 0, "links.inter.bandwidth_GBps: 0 must be a number > 0"),
    ("links.intra.latency_us", -1, "links.intra.latency_us: -1 must be a number >= 0"),
    ("links", None, "profile links: expected a mapping"),
    ("reduce_ns_per_byte", ".", "top level.reduce_ns_per_byte: '.' must be a number >= 0"),
    ("cache_MiB", float("nan"), "top level.cache_MiB: nan must be a number >= 0"),
]


def write_profile(tmp_path, key, value):
    with open(os.path.join(PROFILE_DIR, "abci.yaml")) as f:
        raw = yaml.safe_load(f)
    node, *path = key.split(".")
    where = raw
    for part in [node] + path[:-1] if path else []:
        where = where[part]
    where[path[-1] if path else node] = value
    target = tmp_path / "bad.yaml"
    target.write_text(yaml.safe_dump(raw))
    return str(target)


@pytest.mark.parametrize("key, value, message", PROFILE, ids=[f"{k}={v!r}" for k, v, _ in PROFILE])
def test_profile_values(tmp_path, key, value, message):
    path = write_profile(tmp_path, key, value)
    with pytest.raises(ValueError) as error:
        load_profile(path)
    assert str(error.value).startswith(f"{path}: profile ") and message in str(error.value)


def test_a_malformed_profile_file_is_named(tmp_path):
    """Before: a YAML traceback."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: [1\n")
    with pytest.raises(ValueError) as error:
        load_profile(str(bad))
    assert f"profile '{bad}': cannot read {bad}: while parsing a flow sequence" in \
        str(error.value) and "expected ',' or ']'" in str(error.value)


def test_an_empty_profile_file_is_named(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ValueError, match=f"{empty}: the file is empty"):
        load_profile(str(empty))


# -- no MPI where none is needed ------------------------------------------------------------
def test_importing_the_package_and_planning_start_no_mpi():
    code = ("import sys, nnabla_torus, nnabla_torus.cli.plan as p; p.main(['--max-gpus', "
            "'64', '--json', '/dev/null']); assert 'mpi4py.MPI' not in sys.modules, "
            "'MPI started'; print('NO MPI')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=REPO), timeout=scaled(120))
    assert "NO MPI" in out.stdout, out.stderr


@pytest.mark.parametrize("argv", [["--help"], ["--max-gpus", "64"]], ids=["help", "plan"])
def test_planner_runs_leave_nothing_in_the_temporary_or_shared_memory_folders(tmp_path, argv):
    """Open MPI puts its session folder in TMPDIR and its shared-memory segment (16 MiB,
    normally in /dev/shm, which other jobs on this machine share) in the sm backing folder:
    both point at a fresh folder, which must stay empty (before: 2 entries per call)."""
    env = dict(os.environ, PYTHONPATH=REPO, TMPDIR=str(tmp_path),
               OMPI_MCA_btl_sm_backing_directory=str(tmp_path))
    for _ in range(5):
        done = subprocess.run([sys.executable, "-m", "nnabla_torus.cli.plan", *argv], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=scaled(120))
        assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_call_mismatch_names_the_fields_that_differ():
    """Before: each rank's call as an unlabelled tuple, ('all_reduce', (('float32', (4,)),),
    False, True, False, 'auto', '2x1', False, None)."""
    from nnabla_torus.comm.rendezvous import AllReduceCall, raise_mismatch
    mine = AllReduceCall("all_reduce", (("float32", (4,)),), False, True, False, "auto", "2x1",
                         False, None)
    theirs = mine._replace(arrays=(("float32", (5,)),), division=True)

    class Control:
        def allgather(self, value):
            return [value, theirs, theirs]
    with pytest.raises(ValueError) as error:
        raise_mismatch(Control(), [0, 1, 2], mine, "all_reduce (auto, group 'world')")
    assert str(error.value).splitlines()[1:] == [
        "  arrays: (('float32', (4,)),) on rank(s) [0]; (('float32', (5,)),) on rank(s) [1, 2]",
        "  division: False on rank(s) [0]; True on rank(s) [1, 2]"]
