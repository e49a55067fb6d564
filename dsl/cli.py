"""`dslc`, the command line (docs/language.md §14). User errors exit 1, usage errors 2."""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import time
import traceback



def interrupted(*_signal: object) -> None:
    """Ctrl-C: one line and status 130. By os._exit: once a KeyboardInterrupt has passed through
    code that C ran (as in some imports), CPython would end sys.exit(130) by SIGINT instead."""
    print("dslc: interrupted", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(130)


# Ctrl-C while NumPy and the compiler load: exit 130 from the signal's handler, not by a
# KeyboardInterrupt, which C code on its way may turn into another error (NumPy's import of
# datetime raises an ImportError in its place).
_in_main_thread = threading.current_thread() is threading.main_thread()   # where handlers are set
_on_sigint = signal.signal(signal.SIGINT, interrupted) if _in_main_thread else None
try:
    import numpy as np

    import dsl
    from dsl import npz, safetensors, values

    from frontend.check import check_file
    from frontend.diagnostics import DslError
    from runtime import cache
finally:
    if _in_main_thread:
        signal.signal(signal.SIGINT, _on_sigint or signal.default_int_handler)

REPORT = "this is a bug in dslc: please report it with the input that caused it"


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:
        return dist_version("dslc")
    except PackageNotFoundError:
        return "0+unknown"


def cmd_check(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        try:
            check_file(path)
        except DslError as e:
            print(e, file=sys.stderr)
            failed = True
        else:
            if args.verbose:
                print(f"{path}: ok")
    return 1 if failed else 0


def parse_dims(text: str) -> dict[str, int]:
    """--dims B=4,D=8 (an int for each dimension variable, static int or list length; which
    names an entry takes, and the bounds on their values, dsl/inputs.py checks)."""
    dims = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = (s.strip() for s in part.partition("="))
        if not eq or not name:
            raise argparse.ArgumentTypeError(f"expected NAME=INT, got {part!r}")
        if name in dims:
            raise argparse.ArgumentTypeError(f"{name} is given twice")
        try:
            dims[name] = int(value, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer for {name}, got {value!r}") from None
    return dims


def parse_wrt(text: str) -> str | tuple[str, ...]:
    """--wrt p (one parameter) or --wrt q,k (a tuple of them, as wrt=(q, k) in the language)."""
    return tuple(text.split(",")) if "," in text else text


def cmd_doc(args: argparse.Namespace) -> int:
    print(dsl.load(args.file).doc(), end="")
    return 0


def cmd_ir(args: argparse.Namespace) -> int:
    if args.arch and args.level != "ptx":
        args.usage("--arch is for --level ptx")
    print(dsl.load(args.file).ir(args.entry, args.dims, args.level, args.arch, args.numerics), end="")
    return 0


def cmd_grad(args: argparse.Namespace) -> int:
    wrt = parse_wrt(args.wrt)
    print(dsl.load(args.file).source(args.entry, grad=wrt, dims=args.dims), end="")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    prog = dsl.load(args.file, device=args.device, numerics=args.numerics)
    arrays = read_arrays(args.inputs)
    result = prog.call(args.entry, **prog.inputs_from_arrays(args.entry, arrays, args.dims or {}))
    flat = values.flatten_python(result, "out")
    if args.output:
        try:
            np.savez(args.output, **{k: npz.storable(v) for k, v in flat.items()})
        except (OSError, ValueError) as e:          # a missing folder, a NUL in the name
            raise DslError(None, f"cannot write the result to {args.output}: {e}") from None
    else:
        for name, value in flat.items():
            print(f"{name}: {value.dtype}{list(value.shape)}\n{values.shortest(value)}")
    return 0


def read_arrays(path: str) -> dict[str, np.ndarray]:
    """The named arrays of an .npz or .safetensors file; an unreadable file is a DslError."""
    if path.endswith(".safetensors"):
        return safetensors.read(path)
    try:
        return npz.read(path)
    except npz.NpzError as e:
        raise DslError(None, f"cannot read inputs from {path}: {e.problem}") from None


def parse_values(text: str) -> dict[str, float]:
    """--hyper lr=0.1,wd=0 (a number for each of step's runtime values)."""
    values = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        try:
            if not eq or not name.strip():
                raise ValueError
            values[name.strip()] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected NAME=NUMBER, got '{part}'") from None
    return values


def count(text: str) -> int:
    try:
        n = int(text, 0)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a count (an integer >= 0), got '{text}'")
    return n


def positive(text: str) -> int:
    n = count(text)
    if n == 0:
        raise argparse.ArgumentTypeError(f"expected a count of at least 1, got '{text}'")
    return n


def seconds(text: str) -> float:
    try:
        t = float(text)
    except ValueError:
        t = math.nan
    if not 0 < t < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got '{text}'")
    return t


def seed(text: str) -> int:
    n = count(text)
    if n >= 2 ** 64:
        raise argparse.ArgumentTypeError(f"a seed is an integer in [0, 2**64), got '{text}'")
    return n


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path
    from dsl import distributed
    from dsl.train import train
    if args.ranks is not None:
        return launch_ranks(args)
    ckpt = args.checkpoint_dir if args.checkpoint_dir is not None else \
        str(Path("checkpoints") / Path(args.file).stem)
    try:
        result = train(args.file, steps=args.steps, seed=args.seed, data=args.data,
                       resume=args.resume, checkpoint_dir=ckpt or None,
                       overwrite=args.overwrite, plot=args.plot,
                       dims=args.dims, hyper=args.hyper, batch_size=args.batch_size,
                       device=args.device, numerics=args.numerics, progress=sys.stderr,
                       micro_batches=args.micro_batches,
                       rank_timeout=args.rank_timeout)
    except KeyboardInterrupt:
        interrupted()
    except DslError as e:
        distributed.fail(distributed.world(args.rank_timeout), e)
        raise
    if distributed.world(args.rank_timeout).rank == 0:
        print(result)
    return 0


def launch_ranks(args: argparse.Namespace) -> int:
    """--ranks R: the same command line without it, under `mpiexec -n R`."""
    from dsl import distributed
    if distributed.launched_size() > 1:
        raise DslError(None, "--ranks starts mpiexec itself: give it without mpiexec, or "
                             "mpiexec -n R without --ranks")
    argv = sys.argv[1:] if args.argv is None else args.argv
    rest = [a for i, a in enumerate(argv) if a != "--ranks" and not a.startswith("--ranks=")
            and (i == 0 or argv[i - 1] != "--ranks")]
    try:
        return distributed.launch(args.ranks, rest)
    except KeyboardInterrupt:
        interrupted()


def cmd_compile(args: argparse.Namespace) -> int:
    if args.arch and args.target != "ptx":
        args.usage("--arch is for --target ptx")
    wrt = None if args.grad is None else parse_wrt(args.grad)
    manifest = dsl.load(args.file).compile_to(args.entry, args.target, args.output, args.dims, wrt,
                                              args.arch, args.numerics)
    print(f"{args.output}: {len(manifest['kernels'])} kernels, {len(manifest['steps'])} steps")
    return 0


def gpu_arch(text: str) -> str:
    """--arch sm_86: one of the architectures backend/nvptx.py builds PTX for."""
    from backend.nvptx import ARCHES               # (llvmlite loads only when it is needed)
    if text not in ARCHES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(ARCHES)}, got '{text}'")
    return text


def byte_size(text: str) -> int:
    try:
        return cache.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def size_text(n: int) -> str:
    """'1.5 MiB (1572864 bytes)', or '100 bytes' below a KiB."""
    unit = next((u for u in "TGMK" if n >= cache.UNITS[u]), None)
    return f"{n} bytes" if unit is None else f"{n / cache.UNITS[unit]:.1f} {unit}iB ({n} bytes)"


def amount(entries: list[cache.Entry]) -> str:
    """'3 entries, 1.5 MiB (1572864 bytes)'."""
    return f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {size_text(sum(e.size for e in entries))}"


def cmd_cache(args: argparse.Namespace) -> int:
    """`dslc cache info|clear|prune`: a cache folder that cannot be read is a user error."""
    try:
        args.action(args)
    except OSError as e:
        raise DslError(None, f"cannot use the compile cache in {cache.cache_dir()}: "
                             f"{e.strerror or e}") from None
    return 0


def cache_info(args: argparse.Namespace) -> None:
    found = cache.entries()
    cap = cache.max_size()
    where = "DSLC_CACHE_MAX_SIZE" if os.environ.get("DSLC_CACHE_MAX_SIZE") else "the default"
    print(f"location: {cache.cache_dir()}" + ("" if cache.cache_dir().exists() else " (not made yet)"))
    print(f"entries: {len(found)}, {size_text(sum(e.size for e in found))}")
    print(f"size cap: {size_text(cap)}, {where}")
    for label, e in (("least recently used", found[:1]), ("most recently used", found[-1:])):
        if e:
            print(f"{label}: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e[0].used / 1e9))}")


def cache_clear(args: argparse.Namespace) -> None:
    print(f"removed {amount(cache.clear())} from {cache.cache_dir()}")


def cache_prune(args: argparse.Namespace) -> None:
    removed, kept = cache.prune(args.max_size)
    print(f"removed {amount(removed)}; kept {amount(kept)}")


# the help of arguments several commands share
FILE = "a .bend file"
ENTRY = "the entry point: a function of FILE with annotated parameters"
SIZES = "every size the entry's types leave open: dimensions (B=4), list lengths, static parameters"
ARCH = ("the GPU architecture to build the PTX for: sm_80, sm_86, sm_89, sm_90 (the default), "
        "sm_100 or sm_120")
NUMERICS = ("exact (the default: the same bits on every device) or fast (on the GPU, products "
            "on tensor cores: bf16 and f16 inputs, f32 ones rounded to TF32, f32 sums)")
DEVICE = ("where to run: auto (the GPU if one is usable, else the CPU; $DSLC_DEVICE overrides), "
          "cpu, cuda, reference (the NumPy interpreter), iree (IREE's CPU backend, needs "
          "dslc[iree]) or iree-cuda (IREE's CUDA backend on the GPU)")


def specialising(sub: argparse._SubParsersAction, name: str, summary: str, description: str,
                 sizes: str | None = None) -> argparse.ArgumentParser:
    """A command on one entry point specialised by --dims (ir, grad, compile); with `sizes`
    (its help), --dims is optional."""
    cmd = sub.add_parser(name, help=summary, description=description)
    cmd.add_argument("file", metavar="FILE", help=FILE)
    cmd.add_argument("--entry", required=True, help=ENTRY)
    cmd.add_argument("--dims", type=parse_dims, required=sizes is None, metavar="NAME=INT,…",
                     help=sizes or SIZES)
    return cmd


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dslc", description="The dslc tensor-language compiler.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version",
                   version=f"dslc {version()}\ncompile cache: {cache.cache_dir()}",
                   help="print dslc's version and the compile cache's location, and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           help="one of these (dslc COMMAND -h describes it):")
    check = sub.add_parser("check", help="parse and type-check files; print diagnostics",
                           description="Parse and check each FILE (names, types, shapes) and print "
                           "a diagnostic for each error; exit status 1 if any file has one.")
    check.add_argument("files", nargs="+", metavar="FILE", help=FILE)
    check.add_argument("-v", "--verbose", action="store_true",
                       help="also say 'FILE: ok' for each file without errors")
    check.set_defaults(run=cmd_check)

    doc = sub.add_parser("doc", help="print each definition's signature and doc comment",
                         description="Print each def, object and type of FILE in source order: its "
                         "declaration and the doc comment (#{ ... #}) directly above it.")
    doc.add_argument("file", metavar="FILE", help=FILE)
    doc.set_defaults(run=cmd_doc)

    ir = specialising(sub, "ir", summary="print a stage's output for an entry point",
                      description="Print an entry point, specialised for --dims, at a stage of "
                      "compilation.")
    ir.add_argument("--level", choices=["tensor", "loops", "llvm", "ptx", "mlir"], default="tensor",
                    help="tensor (the tensor IR, the default), loops (the CPU kernels' loop IR and "
                    "host steps), llvm (their LLVM IR), ptx (the GPU kernels) or mlir (the tensor "
                    "IR in MLIR's upstream dialects)")
    ir.add_argument("--arch", type=gpu_arch, metavar="SM", help=ARCH)
    ir.add_argument("--numerics", choices=["exact", "fast"], default="exact", help=NUMERICS + ", for --level ptx")
    ir.set_defaults(run=cmd_ir, usage=ir.error)

    grad = specialising(sub, "grad", summary="print the gradient program as .bend source",
                        description="Print the gradient of an entry point as a .bend program that "
                        "dslc check accepts: specialised for the sizes --dims gives, generic in "
                        "the dimensions it leaves out (all of them without --dims).",
                        sizes="the sizes to specialise for: dimensions (B=4), list lengths, static "
                        "parameters (these two always); a dimension left out stays a name")
    grad.add_argument("--wrt", required=True, metavar="PARAM",
                      help="the parameter to differentiate with respect to, or several separated "
                      "by commas (q,k)")
    grad.set_defaults(run=cmd_grad)

    comp = specialising(sub, "compile", summary="write an entry point's kernels and a JSON manifest",
                        description="Compile an entry point (or its gradient), specialised for "
                        "--dims, into the folder OUT: kernels.o or kernels.ptx, and manifest.json "
                        "naming its parameters, results, kernels and steps.")
    comp.add_argument("--target", choices=["cpu", "ptx"], default="cpu",
                      help="cpu (object code, the default) or ptx (for NVIDIA GPUs)")
    comp.add_argument("--grad", metavar="PARAM",
                      help="compile the entry's value and its gradient with respect to this "
                      "parameter, or several separated by commas (q,k)")
    comp.add_argument("--arch", type=gpu_arch, metavar="SM", help=ARCH + " (with --target ptx)")
    comp.add_argument("--numerics", choices=["exact", "fast"], default="exact", help=NUMERICS)
    comp.add_argument("-o", "--output", required=True, metavar="OUT",
                      help="the folder to write into (made if missing)")
    comp.set_defaults(run=cmd_compile, usage=comp.error)

    run = sub.add_parser("run", help="run an entry point on arrays from a file",
                         description="Run an entry point on named arrays and print its result, or "
                         "write it to an .npz file.")
    run.add_argument("file", metavar="FILE", help=FILE)
    run.add_argument("--entry", required=True, help=ENTRY)
    run.add_argument("--inputs", required=True, metavar="IN.npz",
                     help="an .npz or .safetensors file with one array per parameter "
                     "(records as p.W1, lists as xs[0])")
    run.add_argument("-o", "--output", metavar="OUT.npz",
                     help="write the result here, as arrays out, out[0], out.W1 …, instead of "
                     "printing it")
    run.add_argument("--dims", type=parse_dims, metavar="NAME=INT,…",
                     help="the entry's static parameters (k=2); the arrays give the sizes")
    run.add_argument("--device", choices=["auto", "reference", "cpu", "cuda", "iree", "iree-cuda"], default="auto",
                     help=DEVICE)
    run.add_argument("--numerics", choices=["exact", "fast"], default="exact", help=NUMERICS)
    run.set_defaults(run=cmd_run)

    train = sub.add_parser("train", help="train a model file that defines init, loss and step",
                           description="Train a model file: init, loss and step (and optionally "
                           "init_opt, evaluate, sample), with the data of its loader NAME.py "
                           "(see dsl/train.py for the contract).")
    train.add_argument("file", metavar="FILE", help="the model, NAME.bend (its loader NAME.py "
                       "beside it)")
    train.add_argument("--data", metavar="DATA.npz",
                       help="the examples, instead of the loader's load(): arrays train.x, valid.x, test.x …")
    train.add_argument("--steps", type=count, help="train until this many steps are done")
    train.add_argument("--seed", type=seed, help="the run's seed (default 0); a run is a function of it")
    train.add_argument("--batch-size", type=count, help="examples per step (0: the whole split)")
    train.add_argument("--dims", type=parse_dims, help="static values of the entries (H=64), over the loader's DIMS")
    train.add_argument("--hyper", type=parse_values, help="step's runtime values (lr=0.01), over the loader's")
    train.add_argument("--resume", metavar="CKPT.safetensors", help="go on from a checkpoint (or an .npz one "
                       "of earlier versions)")
    train.add_argument("--checkpoint-dir", metavar="DIR",
                       help="where checkpoints go (default checkpoints/NAME; '' for none)")
    train.add_argument("--overwrite", action="store_true",
                       help="delete the checkpoints already in the checkpoint directory and start afresh")
    train.add_argument("--plot", metavar="LOSS.png",
                       help="draw the loss curves into an image (.png, .svg, .pdf …; needs dslc[plot])")
    train.add_argument("--device", choices=["auto", "reference", "cpu", "cuda", "iree", "iree-cuda"], default="auto",
                       help=DEVICE)
    train.add_argument("--numerics", choices=["exact", "fast"], default="exact", help=NUMERICS)
    train.add_argument("--micro-batches", type=positive, metavar="M",
                       help="cut each step's batch into M micro-batches and sum their gradients "
                       "in a fixed tree (the model needs update); under mpiexec, default: the "
                       "number of ranks")
    train.add_argument("--ranks", type=positive, metavar="R",
                       help="run on R processes: this command under mpiexec -n R")
    train.add_argument("--rank-timeout", type=seconds, default=600.0, metavar="SECONDS",
                       help="how long a rank waits for the others' gradients before it ends the "
                       "job (default 600)")
    train.set_defaults(run=cmd_train)

    cached = sub.add_parser("cache", help="show, clear or prune the compile cache",
                            description="The compile cache: in $DSLC_CACHE_DIR or ~/.cache/dslc, "
                            "kept under $DSLC_CACHE_MAX_SIZE (default 2G) by evicting the least "
                            "recently used entries.")
    cached.set_defaults(run=cmd_cache)
    actions = cached.add_subparsers(required=True, metavar="ACTION", help="one of these:")
    info = actions.add_parser("info", help="where the cache is, its entries, their size and the cap",
                              description="Print the cache's location, its entries' count and "
                              "size, the size cap and when the least and most recently used "
                              "entries were last used.")
    info.set_defaults(action=cache_info)
    clear = actions.add_parser("clear", help="remove every entry (other files stay)",
                               description="Remove every entry of the compile cache; files that "
                               "are not dslc's entries stay.")
    clear.set_defaults(action=cache_clear)
    prune = actions.add_parser("prune", help="evict the least recently used entries until the rest fit",
                               description="Remove the least recently used entries until the rest "
                               "take at most --max-size bytes.")
    prune.add_argument("--max-size", type=byte_size, required=True, metavar="SIZE",
                       help="bytes the entries may take: 1024, 500M, 2G (K, M, G, T: powers of 1024)")
    prune.set_defaults(action=cache_prune)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        args.argv = argv
        return args.run(args)
    except DslError as e:
        print(e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        interrupted()
    except BrokenPipeError:                     # `dslc run … | head`: the reader has had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception:
        traceback.print_exc()
        print(f"dslc: internal error: {REPORT}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
