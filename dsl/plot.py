"""The loss plot of a training run (`dslc train --plot`, `dsl.train(plot=…)`), drawn by
matplotlib: an optional dependency (`dslc[plot]`), imported only when a plot is asked for, and
used through its Agg canvas without pyplot, so a caller's own matplotlib state is left alone."""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dsl.atomic import replacing
from frontend.diagnostics import DslError

INSTALL = "pip install 'dslc[plot]'"
SIZE, DPI = (8.0, 4.5), 150                 # inches: 1200 x 675 pixels in a PNG


def _figure(title: str) -> Any:
    """A figure on an Agg canvas, titled; a diagnostic that says how to install matplotlib
    when it is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise DslError(None, f"a loss plot needs matplotlib, which is not installed: {INSTALL}") from None
    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title, fontsize=12)
    return fig


def check_plot_path(path: str) -> None:
    """Fail before a run, not after it, when its plot could not be written to `path`: no
    matplotlib, a format it cannot write here, a folder that is missing or not writable."""
    def fail(why: object) -> DslError:
        return DslError(None, f"cannot write the plot {path}: {why}")

    fig, where = _figure("probe"), Path(path)
    if where.is_dir():
        raise fail("it is a directory")
    formats = fig.canvas.get_supported_filetypes()
    ext = where.suffix[1:].lower()
    if ext not in formats:
        raise fail(f"matplotlib writes {', '.join('.' + f for f in sorted(formats))}, "
                   f"not {where.suffix or 'a file without an extension'}")
    try:                                    # some formats need more than matplotlib (pgf: LaTeX)
        fig.savefig(io.BytesIO(), format=ext)
    except Exception as e:                  # noqa: BLE001 — whatever the format's writer raises
        raise fail(f"matplotlib cannot write .{ext} here: {type(e).__name__}: {e}") from None
    if not where.parent.is_dir():
        raise fail(f"the folder {where.parent} does not exist")
    try:
        fd, probe = tempfile.mkstemp(dir=where.parent, prefix=f".{where.name}.", suffix=".tmp")
    except (OSError, ValueError) as e:      # not writable; a NUL in the name
        raise fail(getattr(e, "strerror", None) or e) from None
    os.close(fd)
    os.unlink(probe)


def smoothed(steps: np.ndarray, losses: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean of each `window` consecutive losses, at the window's middle step (centred, so
    the curve does not lag behind the losses it averages)."""
    if len(losses) < window:
        return steps[:0], losses[:0]
    mean = np.convolve(losses, np.ones(window) / window, mode="valid")
    return steps[(window - 1) // 2:][:len(mean)], mean


def plot_losses(path: str, losses: list[float], evals: list[tuple[int, float]], title: str) -> None:
    """Each step's training loss (faint), its moving average, and the validation losses
    (markers), against the step, into `path` in the format its extension names."""
    fig = _figure(title)
    ax = fig.add_subplot()
    y = np.asarray(losses, np.float64)
    steps = np.arange(1, len(y) + 1)            # the loss of step t is known after t + 1 steps
    ok = np.isfinite(y)                         # a resumed run may lack the loss of one step
    steps, y = steps[ok], y[ok]
    window = len(y) // 20                       # too few steps to smooth: the losses themselves
    if window > 1:
        ax.plot(steps, y, color="C0", alpha=0.25, linewidth=0.7, label="training loss (one batch)")
        ax.plot(*smoothed(steps, y, window), color="C0", linewidth=2,
                label=f"training loss (mean of {window} steps)")
    else:
        ax.plot(steps, y, color="C0", linewidth=2, label="training loss")
    if evals:
        ev_steps, ev_losses = zip(*evals)
        ax.plot(ev_steps, ev_losses, "o-", color="C1", linewidth=1.2, markersize=6,
                clip_on=False, zorder=3, label="validation loss")   # the last is on the edge
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    ax.set_xlim(0, max([len(losses), *(s for s, _ in evals), 1]))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", framealpha=0.9)
    _save(fig, path)


def _save(fig: Any, path: str) -> None:
    """fig written whole or not at all (dsl/atomic.py)."""
    where = Path(path)
    try:
        with replacing(where) as tmp:
            fig.savefig(tmp, format=where.suffix[1:].lower())
    except (OSError, ValueError) as e:
        raise DslError(None, f"cannot write the plot {path}: {getattr(e, 'strerror', None) or e}") from None
