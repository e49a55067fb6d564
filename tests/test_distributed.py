"""Data parallelism as a user relies on it (docs/distributed.md): M micro-batches summed in one
fixed tree, so that a run on R = 1, 2 or 4 MPI ranks ends with the same bits; and every bad
configuration, a rank that dies and a rank that hangs end with a diagnostic, in bounded time."""
from __future__ import annotations

import ctypes
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import dsl
from conftest import dslc, quick, raises, slow, user_error
from dsl import distributed, safetensors
from dsl.train import batch_indices

ROOT = Path(__file__).resolve().parents[1]
XOR = ROOT / "examples" / "xor.bend"
NAMES = ROOT / "examples" / "names_mlp.bend"
RESNET = ROOT / "examples" / "resnet_digits.bend"


# ---------------------------------------------------------------- the tree

def test_the_tree_is_pairwise_with_an_odd_node_moving_up():
    def show(lo: int, hi: int) -> str:
        return distributed.tree_sum(str, lambda a, b: f"({a}+{b})", lo, hi)
    assert show(0, 1) == "0"
    assert show(0, 4) == "((0+1)+(2+3))"
    assert show(0, 6) == "(((0+1)+(2+3))+(4+5))"
    assert show(0, 7) == "(((0+1)+(2+3))+((4+5)+6))"


def test_a_share_sums_the_largest_nodes_inside_it():
    assert distributed.frontier(0, 8, 8) == [(0, 8)]
    assert distributed.frontier(4, 8, 8) == [(4, 8)]
    assert distributed.frontier(3, 6, 6) == [(3, 4), (4, 6)]
    assert distributed.frontier(2, 4, 6) == [(2, 4)]


class Threads:
    """R ranks as threads of this process, gathering through a shared table: the schedule of
    distributed.reduce without a communicator."""

    def __init__(self, size: int):
        self.size, self.table, self.barrier = size, {}, threading.Barrier(size)

    def rank(self, r: int):
        team = self

        class Rank:
            rank, size = r, team.size
            keep = staticmethod(np.asarray)

            def gather(self, mine, counts, step):
                team.table[r] = mine
                team.barrier.wait()
                assert [len(team.table[q]) for q in range(team.size)] == list(counts)
                got = [team.table[q] for q in range(team.size)]
                team.barrier.wait()
                return got
        return Rank()


def on_threads(ranks: int, run) -> list:
    """run(r) for r = 0 … ranks-1, each in a thread of its own, all at once: their results."""
    out = [None] * ranks

    def one(r: int) -> None:
        out[r] = run(r)
    threads = [threading.Thread(target=one, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def reduce_on(ranks: int, leaves: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """Every rank's result of distributed.reduce over the leaves, R ranks at once."""
    team = Threads(ranks)
    return on_threads(ranks, lambda r: distributed.reduce(lambda i: leaves[i], len(leaves),
                                                          team.rank(r), step=0))


def random_leaves(m: int, seed: int) -> list[list[np.ndarray]]:
    """m micro-batches' [loss, gradient] of f32 random numbers."""
    rng = np.random.default_rng(seed)
    return [[np.float32(rng.standard_normal()), rng.standard_normal((3, 5)).astype(np.float32)]
            for _ in range(m)]


@pytest.mark.parametrize("m, ranks", [(6, 2), (6, 3), (6, 6), (8, 4), (12, 3)])
def test_every_rank_count_reduces_to_the_bits_of_one_process(m, ranks):
    leaves = random_leaves(m, m * ranks)
    want = distributed.reduce(lambda i: leaves[i], m, distributed.Solo(), step=0)
    exact = np.sum([np.float64(leaf[0]) for leaf in leaves]) / m
    assert abs(want[0] - exact) < 1e-6 * max(1.0, abs(exact))
    for got in reduce_on(ranks, leaves):
        assert all(g.dtype == w.dtype and g.tobytes() == w.tobytes() for g, w in zip(got, want))


# ---------------------------------------------------------------- the same schedule through NCCL

class FakeNccl:
    """cupy.cuda.nccl's grouped send and receive between threads that share the fake GPU
    driver's memory (host memory): a send is posted at once, a receive waits for its send at
    the group's end, as NCCL completes a group's calls together."""
    NCCL_UINT8 = 7

    def __init__(self, size: int):
        self.mail = {(a, b): queue.Queue() for a in range(size) for b in range(size)}
        self.group = threading.local()
        self.sent = 0

    def groupStart(self) -> None:
        self.group.receives = []

    def groupEnd(self) -> None:
        for ptr, count, src, dst in self.group.receives:
            data = self.mail[(src, dst)].get(timeout=30)
            assert len(data) == count
            ctypes.memmove(ptr, data, count)
        del self.group.receives

    def comm(self, rank: int):
        lib = self

        class Comm:
            def send(self, ptr, count, dtype, peer, stream):
                assert dtype == lib.NCCL_UINT8 and stream == 0
                lib.sent += count
                lib.mail[(rank, peer)].put(ctypes.string_at(ptr, count))

            def recv(self, ptr, count, dtype, peer, stream):
                assert dtype == lib.NCCL_UINT8 and stream == 0
                lib.group.receives.append((ptr, count, peer, rank))     # outside a group: fails
        return Comm()


@pytest.fixture
def fake_gpu(monkeypatch):
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from test_cuda import FakeDriver, install
    return install(monkeypatch, FakeDriver())


def on_gpu(leaves: list[list[np.ndarray]]) -> list[list]:
    """The leaves as DeviceArrays, as the model's gradient on the GPU gives them."""
    copy = dsl.loads("def f(l: f32, g: f32[3, 5]) -> (f32, f32[3, 5]):\n  return l + 0.0, g + 0.0\n",
                     device="cuda").f
    return [list(copy(*leaf)) for leaf in leaves]


@pytest.mark.parametrize("m, ranks", [(6, 2), (8, 4), (6, 3)])
def test_nccl_ranks_sum_on_the_gpus_to_the_bits_of_one_process(fake_gpu, m, ranks):
    from runtime.cuda import DeviceArray
    leaves = random_leaves(m, m + ranks)
    want = distributed.reduce(lambda i: leaves[i], m, distributed.Solo(), step=0)
    device, lib = on_gpu(leaves), FakeNccl(ranks)

    def rank(r: int):
        team = distributed.Nccl(SimpleNamespace(rank=r, size=ranks, timeout=30.0), lib, lib.comm(r))
        return team, distributed.reduce(lambda i: device[i], m, team, step=0)
    nodes = [len(distributed.frontier(r * m // ranks, (r + 1) * m // ranks, m)) for r in range(ranks)]
    node = 4 + 15 * 4                                               # bytes: the loss, the gradient
    for r, (team, got) in enumerate(on_threads(ranks, rank)):
        assert all(isinstance(g, DeviceArray) for g in got)          # summed on the device
        assert all(np.asarray(g).tobytes() == w.tobytes() for g, w in zip(got, want))
        assert team.bytes == node * (sum(nodes) - nodes[r])
    assert lib.sent == node * sum(nodes) * (ranks - 1)


def test_an_nccl_peer_that_never_sends_ends_the_wait(fake_gpu):
    lib = FakeNccl(2)
    team = distributed.Nccl(SimpleNamespace(rank=0, size=2, timeout=0.2), lib, lib.comm(0))
    mine = on_gpu(random_leaves(1, 0))
    lib.groupEnd = lambda: None                      # the receive is posted, and never completes
    fake_gpu.never_done = True
    raises(lambda: team.gather(mine, [1, 1], step=7),
           "rank 0: rank 1 exchanged no gradients for step 7 within 0.2 s: it died or hang")


def test_gpu_ranks_without_cupy_are_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)                  # import cupy: ImportError
    comm = SimpleNamespace(Get_rank=lambda: 0, Get_size=lambda: 2)
    mpi = distributed.Mpi(comm, 1.0)
    assert distributed.on_device(mpi, "cpu") is mpi
    raises(lambda: distributed.on_device(mpi, "cuda"), "--device cuda on 2 ranks combines the "
           "gradients with NCCL, but CuPy is not installed: pip install 'dslc[nccl]'")


# ---------------------------------------------------------------- micro-batches on one process

def same_bits(a, b) -> bool:
    fa, fb = dsl.values.flatten_python(a, "v"), dsl.values.flatten_python(b, "v")
    return fa.keys() == fb.keys() and all(fa[k].tobytes() == fb[k].tobytes() for k in fa)


def test_one_micro_batch_is_the_models_own_step():
    for path in (XOR, NAMES):
        a = dsl.train(str(path), steps=3, progress=None, final_eval=False)
        b = dsl.train(str(path), steps=3, progress=None, final_eval=False, micro_batches=1)
        assert same_bits(a.params, b.params) and same_bits(a.opt_state, b.opt_state)
        assert a.losses == b.losses


def test_micro_batches_average_the_batchs_gradient():
    """xor's full batch of 4 as 4 micro-batches of one example: the same descent to ~1 ulp a
    step (the sum's order differs), not the same bits."""
    whole = dsl.train(str(XOR), steps=5, progress=None, final_eval=False)
    micro = dsl.train(str(XOR), steps=5, progress=None, final_eval=False, micro_batches=4)
    for k in whole.params:
        np.testing.assert_allclose(micro.params[k], whole.params[k], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(micro.losses, whole.losses, rtol=1e-5)


def test_micro_batches_need_update(tmp_path):
    src = XOR.read_text()
    no_update = src.replace("return update(p, g, lr), l", "return map(lambda w, d: w - lr * d, p, g), l")
    no_update = no_update.split("#{ The optimizer step given")[0] + "def step(" + no_update.split("def step(")[1]
    (tmp_path / "m.bend").write_text(no_update)
    (tmp_path / "m.py").write_text((XOR.with_suffix(".py")).read_text())
    raises(lambda: dsl.train(str(tmp_path / "m.bend"), steps=1, progress=None, micro_batches=2),
           "defines no 'update'", "update(p, g, …) -> P")


def test_a_batch_that_does_not_split_is_an_error():
    raises(lambda: dsl.train(str(XOR), steps=1, progress=None, micro_batches=3),
           "the batch of 4 examples does not split into 3 equal micro-batches")
    user_error(dslc("train", str(XOR), "--steps", "1", "--micro-batches", "3", "--checkpoint-dir", ""),
               "does not split into 3 equal micro-batches")


def test_one_micro_batch_moves_the_buffers_as_step_does(tmp_path):
    path = tiny(tmp_path, RESNET)
    a = dsl.train(str(path), steps=3, device="reference", progress=None, final_eval=False)
    b = dsl.train(str(path), steps=3, device="reference", progress=None, final_eval=False, micro_batches=1)
    assert same_bits(a.params, b.params) and same_bits(a.opt_state, b.opt_state)
    assert a.losses == b.losses


def test_micro_batches_move_the_buffers_by_their_mean(tmp_path):
    """One step as 4 micro-batches: the first batch norm's running mean moves by the mean of
    the micro-batches' means, the whole batch's mean to rounding."""
    path = tiny(tmp_path, RESNET)
    whole = dsl.train(str(path), steps=1, device="reference", progress=None, final_eval=False)
    micro = dsl.train(str(path), steps=1, device="reference", progress=None, final_eval=False,
                      micro_batches=4)
    np.testing.assert_allclose(micro.params.bn.running_mean, whole.params.bn.running_mean, rtol=1e-5)
    assert np.abs(whole.params.bn.running_mean).min() > 1e-4


def test_buffers_without_train_loss_are_an_error(tmp_path):
    path = tiny(tmp_path, RESNET)
    path.write_text(path.read_text().replace("train_loss", "moved_loss"))
    r = dslc("train", str(path), "--steps", "1", "--micro-batches", "2", "--device", "reference",
             "--checkpoint-dir", "", timeout=120)
    user_error(r, f"error: {path} has buffers (p.bn.running_mean, …) that training on "
                  "micro-batches or several ranks would never move: define train_loss(p, <batch>) "
                  "-> (f32, P)")


def test_buffers_of_integers_are_an_error(tmp_path):
    """A count of batches cannot be averaged in its dtype."""
    src = XOR.read_text().replace("b2: f32[1] }", "b2: f32[1], buffer n: i32[1] }")
    src = src.replace("b2: zeros([1]),", "b2: zeros([1]), n: zeros([1], dtype=i32),")
    (tmp_path / "m.bend").write_text(src + "\ndef train_loss(p: Params, x: f32[B, 2], y: f32[B]) -> "
                                     "(f32, Params):\n  return loss(p, x, y), p with { n: p.n + 1 }\n")
    (tmp_path / "m.py").write_text(XOR.with_suffix(".py").read_text())
    raises(lambda: dsl.train(str(tmp_path / "m.bend"), steps=1, progress=None, micro_batches=2),
           "the buffer p.n is i32[1]: training on micro-batches or several ranks averages "
           "buffers, which must be floats")


# ---------------------------------------------------------------- ranks



def trained(path: Path, tmp: Path, *args: str) -> dict[str, np.ndarray]:
    """The weights, optimizer state and losses of `dslc train path --steps 3 ARGS` on the
    interpreter (tiny models train faster there than they compile), from its final checkpoint."""
    out = tmp / "_".join(args).replace("/", "_")
    r = dslc("train", str(path), "--steps", "3", "--device", "reference", "--checkpoint-dir", str(out),
             *args, timeout=120)
    assert r.returncode == 0, r.stderr
    tensors = safetensors.read(out / "step0000003.safetensors")
    return {k: a for k, a in tensors.items() if k.startswith(("p.", "opt")) or k == "loss"}


def trainable() -> list[Path]:
    """The examples that `dslc train` trains: a model that defines step, and a loader."""
    return sorted(b for b in (ROOT / "examples").glob("*.bend")
                  if "\ndef step(" in b.read_text() and b.with_suffix(".py").exists())


# each example at sizes that compile and train in seconds; one not listed trains as it is
TINY = {"gpt": {"D": 16, "L": 1, "H": 2, "G": 1, "T": 8}, "bert": {"D": 16, "L": 1, "H": 2, "G": 2, "T": 32},
        "names_mlp": {"E": 4, "H": 16}, "lstm_chars": {"H": 8}, "cnn_digits": {"C1": 4, "C2": 4},
        "resnet_digits": {"C": 4}}

TRAIN_ONLY = """
def _train_only(hook):
    return lambda split, *args: hook(split, *args) if split == "train" else None


if "size" in globals():
    size = _train_only(size)
else:
    load = _train_only(load)
"""


def tiny(tmp: Path, example: Path) -> Path:
    """A copy of the example at TINY's sizes, with batches of 8, and no split but the training
    one: rank 0's final evaluation is no part of the promise, and the longest part of a run."""
    path = quick(tmp, example, TINY.get(example.stem), batch_size=8, eval_examples=8)
    with (tmp / "m.py").open("a") as f:
        f.write(TRAIN_ONLY)
    return path


def initial_buffers(path: Path) -> dict[str, np.ndarray]:
    """The buffers of a model file's parameters as its init makes them, by checkpoint name."""
    fresh = dsl.train(str(path), steps=0, device="reference", progress=None, final_eval=False).params
    leaves = dsl.values.flatten_python(fresh, "p")
    return {name: leaves[name] for name in dsl.load(str(path)).buffers("loss", "p", fresh)}


def test_every_trainable_example_is_found():
    assert {"xor", "names_mlp", "cnn_digits", "lstm_chars", "gpt", "bert"} <= {b.stem for b in trainable()}


# xor and the GPT (a small model and a transformer) by default; the names MLP and the LSTM
# take 14-17 s each here, the convolutional and BERT runs 25-35 s: DSLC_SLOW=1 runs them
@pytest.mark.parametrize("example", [pytest.param(b, marks=[] if b.stem in ("xor", "gpt")
                                                  else [slow]) for b in trainable()], ids=lambda b: b.stem)
def test_one_two_and_four_ranks_train_the_same_bits(example, tmp_path):
    path = tiny(tmp_path, example)
    one = trained(path, tmp_path, "--micro-batches", "4")
    for ranks in ("2", "4"):
        many = trained(path, tmp_path, "--micro-batches", "4", "--ranks", ranks)
        assert many.keys() == one.keys()
        for k in one:
            assert many[k].tobytes() == one[k].tobytes(), (ranks, k)
    for name, start in initial_buffers(path).items():       # batch norm's running statistics
        assert not np.array_equal(one[name], start), name


def test_rank_0_alone_writes_and_a_run_resumes_on_another_rank_count(tmp_path):
    path = tiny(tmp_path, NAMES)
    straight = trained(path, tmp_path, "--micro-batches", "4")
    half = tmp_path / "half"
    r = dslc("train", str(path), "--steps", "1", "--micro-batches", "4", "--ranks", "2",
             "--device", "reference", "--checkpoint-dir", str(half), "--plot", str(tmp_path / "loss.png"),
             timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("trained") == 1 and r.stderr.count("training ") == 1
    assert "4 micro-batches on 2 ranks" in r.stderr
    assert sorted(p.name for p in half.iterdir()) == ["step0000001.safetensors"]
    assert (tmp_path / "loss.png").read_bytes().startswith(b"\x89PNG")
    resumed = trained(path, tmp_path, "--micro-batches", "4", "--ranks", "4",
                      "--resume", str(half / "step0000001.safetensors"))
    for k in straight:
        assert resumed[k].tobytes() == straight[k].tobytes(), k


def test_ranks_that_do_not_divide_the_micro_batches_are_an_error():
    r = dslc("train", str(XOR), "--steps", "1", "--micro-batches", "3", "--ranks", "2",
             "--checkpoint-dir", "", timeout=120)
    user_error(r, "error: 3 micro-batches do not share out over 2 ranks: give --micro-batches a "
                  "multiple of 2\n")
    assert "MPI_Abort" not in r.stderr


def dying(tmp_path: Path, how: str) -> Path:
    """xor, with a loader whose hyper() at step 2 on rank 1 runs `how`."""
    loader = XOR.with_suffix(".py").read_text().replace("HYPER = {\"lr\": 0.5}", f"""
import os, signal


def hyper(t):
    if t == 2 and os.environ.get("PMI_RANK") == "1":
        {how}
    return {{"lr": 0.5}}
""")
    (tmp_path / "m.py").write_text(loader)
    (tmp_path / "m.bend").write_text(XOR.read_text())
    return tmp_path / "m.bend"


def test_a_rank_that_dies_ends_the_job_naming_it(tmp_path):
    path = dying(tmp_path, "os.kill(os.getpid(), signal.SIGKILL)")
    r = dslc("train", str(path), "--steps", "50", "--ranks", "2", "--checkpoint-dir", "", timeout=120)
    user_error(r, "mpiexec stopped the other ranks")
    assert re.search(r"dslc: rank 1 \(process \d+\) ended (with Killed \(signal 9\)|first)", r.stderr), r.stderr


def test_the_rank_that_ended_first_is_named_where_mpich_names_another(tmp_path):
    """MPICH's banner may name rank 0, which mpiexec killed once rank 1 died (a race)."""
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    for rank, process in enumerate(ranks):
        (tmp_path / str(process.pid)).write_text(str(rank))
    ends = distributed.Ends(tmp_path, 2)
    try:
        time.sleep(0.2)                                      # the watcher opens both
        for process in reversed(ranks):                      # rank 1 first, then rank 0
            process.kill()
            process.wait()
            time.sleep(0.1)
        banner = ["=" * 10 + "\n", f"=   PID {ranks[0].pid} RUNNING AT vm\n", "=   EXIT CODE: 9\n",
                  "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)\n",
                  "Please see the FAQ page\n"]
        assert distributed._death(banner, ends) == (f"dslc: rank 1 (process {ranks[1].pid}) ended first, "
                                        "unexpectedly; mpiexec stopped the other ranks")
        assert ends.first() == ranks[1].pid
    finally:
        ends.close()


def test_a_rank_that_hangs_ends_the_job_naming_it(tmp_path):
    path = dying(tmp_path, "os.kill(os.getpid(), signal.SIGSTOP)")
    # compiled first, on one rank, so that both ranks load their first step from the cache:
    # the wait covers the first step's compilation, and under CI's load rank 1 once compiled
    # more than the 3 s after rank 0 (step 0 named, not 3)
    warm = dslc("train", str(path), "--steps", "1", "--micro-batches", "2", "--checkpoint-dir", "")
    assert warm.returncode == 0, warm.stderr
    r = dslc("train", str(path), "--steps", "50", "--ranks", "2", "--checkpoint-dir", "",
             "--rank-timeout", "3", timeout=120)
    user_error(r, "rank 0: rank 1 exchanged no gradients for step 3 within 3 s: it died or hang")


def test_without_mpi4py_ranks_are_an_error(tmp_path):
    (tmp_path / "mpi4py").mkdir()
    (tmp_path / "mpi4py" / "__init__.py").write_text("raise ImportError('no MPI here')\n")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}"}
    user_error(dslc("train", str(XOR), "--ranks", "2", env=env), "--ranks needs mpi4py",
               "pip install 'dslc[distributed]'")
    user_error(dslc("train", str(XOR), "--steps", "1", env={**env, "PMI_SIZE": "2"}),
               "one of 2 ranks that mpiexec started, but mpi4py is not installed")


# ---------------------------------------------------------------- examples on demand

ON_DEMAND = """
import os

import numpy as np

X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]] * 4, np.float32)
Y = np.array([0, 1, 1, 0] * 4, np.float32)
DIMS = {"H": 8}
SETTINGS = {"batch_size": 8, "samples": False}
HYPER = {"lr": 0.5}


def size(split):
    return SIZE if split == "train" else None


def rows(split, index, rank, ranks):
    with open(os.path.join(os.path.dirname(__file__), f"asked{rank}"), "a") as f:
        f.write(f"{ranks} {' '.join(map(str, index))}\\n")
    return ROWS(index)


SIZE, ROWS = 16, lambda index: {"x": X[index], "y": Y[index]}
"""


def on_demand(tmp_path: Path, tail: str = "") -> Path:
    """xor on 16 examples fetched by size and rows, which note each rank's positions;
    `tail` redefines what they give."""
    (tmp_path / "m.bend").write_text(XOR.read_text())
    (tmp_path / "m.py").write_text(ON_DEMAND + tail)
    return tmp_path / "m.bend"


def test_each_rank_asks_the_loader_for_its_own_micro_batches_only(tmp_path):
    r = dslc("train", str(on_demand(tmp_path)), "--steps", "2", "--micro-batches", "4",
             "--ranks", "2", "--device", "reference", "--checkpoint-dir", "", timeout=120)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        asked = (tmp_path / f"asked{rank}").read_text().splitlines()
        want = [batch_indices(0, t, 16, 8)[4 * rank:4 * rank + 4] for t in (0, 1)]
        assert asked[:2] == ["2 " + " ".join(map(str, w)) for w in want]
    assert len(asked) == 2                  # rank 1 does not evaluate: rank 0 asks for those


def test_examples_on_demand_train_as_the_same_arrays_loaded(tmp_path):
    (tmp_path / "whole").mkdir()
    whole = on_demand(tmp_path / "whole", "del size, rows\n\n\ndef load(split):\n"
                                          "    return {'x': X, 'y': Y} if split == 'train' else None\n")
    a, b = (dsl.train(str(path), steps=3, progress=None, checkpoint_dir=None, final_eval=False,
                      micro_batches=2) for path in (whole, on_demand(tmp_path)))
    assert same_bits(a.params, b.params) and a.losses == b.losses


@pytest.mark.parametrize("tail, message", [
    ("del size\n", "m.py defines rows but not size: examples on demand need size(split)"),
    ("SIZE = 0\n", "m.py: size('train') must be a number of examples (at least 1) or None, got 0"),
    ("SIZE = 2.5\n", "size('train') must be a number of examples (at least 1) or None, got 2.5"),
    ("ROWS = lambda index: {'x': X[:3], 'y': Y[:3]}\n",
     "m.py: rows('train', …, 0, 1) gave 3 examples for 8 positions: x: f32[3, 2], y: f32[3]"),
    ("ROWS = lambda index: [X[index]]\n", "rows('train', …, 0, 1) must return a dict of named arrays"),
    ("ROWS = lambda index: 1 / 0\n", "rows('train', …, 0, 1) failed at line"),
])
def test_a_loader_on_demand_that_misbehaves_is_an_error(tmp_path, tail, message):
    raises(lambda: dsl.train(str(on_demand(tmp_path, tail)), steps=1, progress=None,
                             checkpoint_dir=None), message)
