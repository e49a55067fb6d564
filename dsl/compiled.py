"""An entry point as a Python callable: `prog.compile("loss")` or `prog.loss`, with the .bend
signature and doc comment that inspect.signature, help() and IPython show."""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from dsl.doc import text
from dsl.inputs import literal_default
from frontend import ast
from frontend.diagnostics import DslError

if TYPE_CHECKING:
    from dsl.program import Lowered, Program


class Compiled:
    """An entry point of a program on one device; calls are specialised per input signature
    (shapes, dtypes, static values) and cached."""

    def __init__(self, program: Program, d: ast.Def):
        self._program = program
        self.__name__ = self.__qualname__ = d.name
        self.__doc__ = d.doc
        self.__signature__ = signature(d)
        self.device = program.device
        self.numerics = program.numerics

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._program.call(self.__name__, *args, **kwargs)

    # A descriptor, as a Python function is (one that does not bind): inspect and pydoc then
    # take it for a routine, so help() shows its signature and doc comment.
    def __get__(self, instance: Any, owner: type | None = None) -> Compiled:
        return self

    def __repr__(self) -> str:
        numerics = ", fast numerics" if self.numerics == "fast" else ""
        return f"<dsl entry point {self.__name__}{self.__signature__} on {self.device}{numerics}>"

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """The entry point specialised for these inputs (checked and lowered, not run); print
        it for its tensor IR."""
        return self._program.lower(self.__name__, args, kwargs)[0]

    def ir(self, level: str = "tensor", dims: dict[str, int] | None = None,
           arch: str | None = None) -> str:
        """What `prog.ir` and `dslc ir` print: a stage of compilation ('tensor', 'loops', 'llvm',
        'ptx', for the GPU architecture `arch`), for `dims` or else for the inputs of the last
        call or lower()."""
        return self._program.ir(self.__name__, dims, level, arch)

    def source(self, grad: str | tuple[str, ...] | None = None,
               dims: dict[str, int] | None = None) -> str:
        """What `prog.source` and `dslc grad` print: the entry point, or its gradient with
        respect to `grad`, as .bend source."""
        return self._program.source(self.__name__, grad, dims)


class _Text(str):
    """A piece of .bend source, shown as written (`f32[B, D]`, not `'f32[B, D]'`) where
    inspect formats an annotation or a default by its repr."""

    def __repr__(self) -> str:
        return str(self)


def signature(d: ast.Def) -> inspect.Signature:
    """d's parameters by name, their annotations and defaults as written, and its result type."""
    params = [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=_Text(text(p.type)) if p.type else inspect.Parameter.empty,
                                default=_default(p)) for p in d.params]
    returns = _Text(text(d.ret)) if d.ret else inspect.Signature.empty
    # .bend allows a parameter without a default after one with a default, which Python's
    # validation refuses; the signature states the function as it is.
    return inspect.Signature(params, return_annotation=returns, __validate_parameters__=False)


def _default(p: ast.Param) -> Any:
    """A default's value where it is a literal (as a call takes it), else its source."""
    if p.default is None:
        return inspect.Parameter.empty
    try:
        return literal_default(p)
    except DslError:                     # not a literal: a call must give this argument
        return _Text(text(p.default))
