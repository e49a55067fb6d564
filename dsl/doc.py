"""A module's documentation as text: each definition's signature and doc comment, in source
order (what `dslc doc` prints and the API's callables show as their signature and __doc__)."""
from __future__ import annotations

from frontend import ast
from frontend.ast import source_text


def document(module: ast.Module) -> str:
    """Every top-level def, object and type of `module`: its declaration, then its doc comment
    indented below it; a blank line between items."""
    items = [item for item in module.items if isinstance(item, (ast.Def, ast.ObjectDef, ast.TypeDef))]
    return "\n".join(_entry(declaration(item), item.doc) for item in items)


def declaration(item: ast.Def | ast.ObjectDef | ast.TypeDef) -> str:
    """An item's declaration without its body, as written (whitespace within a line collapsed)."""
    match item:
        case ast.Def():
            params = ", ".join(text(p) for p in item.params)
            return f"def {item.name}({params})" + (f" -> {text(item.ret)}" if item.ret else "")
        case ast.ObjectDef():
            dims = f"[{', '.join(item.dims)}]" if item.dims else ""
            return f"object {item.name}{dims} {{ {', '.join(text(f) for f in item.fields)} }}"
        case ast.TypeDef():
            params = f"({', '.join(item.params)})" if item.params else ""
            return "\n  ".join([f"type {item.name}{params}:", *(text(c) for c in item.ctors)])


def text(node) -> str:
    """The source of a node on one line: `f32[B, D]`, `eps: float = 1e-5`."""
    return " ".join(source_text(node).split())


def _entry(head: str, doc: str | None) -> str:
    return head + "\n" + "".join(f"    {line}".rstrip() + "\n" for line in (doc or "").splitlines())
