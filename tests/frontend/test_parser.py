"""The parser: each construct of docs/language.md §2–§9 gives the right AST with spans into the source,
and malformed input raises ParseError, never anything else, at a useful position."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frontend import ast
from frontend.diagnostics import ParseError, Source
from frontend.parser import parse

MLP = '''\
#{ Bengio et al. 2003: a character-level MLP language model. #}
from nn import linear, cross_entropy

object Params { C: f32[V, E], W1: f32[T * E, H], b1: f32[H], W2: f32[H, V], b2: f32[V] }

def init(key: Key, V: int, T: int, E: int, H: int) -> Params:
  k = split(key, 3)
  return Params {
    C: normal(k[0], [V, E]),
    W1: normal(k[1], [T * E, H]) * (5.0 / 3.0) / sqrt(T * E),
    b1: zeros([H]),
    W2: normal(k[2], [H, V]) * 0.01,
    b2: zeros([V]),
  }

def logits(p: Params, x: i32[B, T]) -> f32[B, V]:
  e = p.C[x]                                   # gather: f32[B, T, E]
  h = tanh(reshape(e, [B, T * E]) @ p.W1 + p.b1)
  return h @ p.W2 + p.b2

def loss(p: Params, x: i32[B, T], y: i32[B]) -> f32:
  return cross_entropy(logits(p, x), y)

def step(p: Params, x: i32[B, T], y: i32[B], lr: f32) -> (Params, f32):
  l, g = value_and_grad(loss, wrt=p)(p, x, y)
  return map(lambda w, d: w - lr * d, p, g), l
'''

FOLDS = '''\
def rnn(p: Params, xs: f32[T, B, D]) -> f32[T, B, H]:
  # an RNN over time: xs: f32[T, B, D]
  hs = fold x in xs with h = zeros([B, H]):
    h = tanh(x @ p.Wx + h @ p.Wh + p.b)
    return h                      # hs: f32[T, B, H]; after the fold, h is the last state
  return hs

def stack(p: Model, x: f32[B, T, C]) -> f32[B, T, C]:
  # a stack of transformer blocks: blocks: List(Block)
  fold blk in p.blocks with h = x:
    h = block(blk, h)
  return h
'''

BEND = '''\
def tree_sum(depth: int, x: f32[N]) -> f32[N]:
  bend d = 0:
    when d < depth:
      y = fork(d + 1) + fork(d + 1)
    else:
      y = x
  return y
'''

ADT = '''\
#{ A binary tree of static values. #}
type Tree(T):
  Node { ~left: Tree(T), ~right: Tree(T) }
  Leaf { value }

type Shape:
  Rect { w: f32, h }
  Circle { r: f32 }
  Empty

def total(t: Tree) -> int:
  fold t with acc = 0:
    case Tree/Node:
      return t.left + t.right
    case Tree/Leaf:
      return t.value + acc
'''


def parse_text(text: str) -> ast.Module:
    return parse(Source("test.bend", text))


def body(text: str) -> tuple:
    """The statements of `text`, parsed as the body of a function."""
    lines = "".join(f"  {line}\n" for line in text.splitlines())
    return parse_text(f"def f():\n{lines}").items[0].body


def expr(text: str):
    return body(f"return {text}")[0].value


def text_at(span) -> str:
    return span.source.text[span.start:span.end]


def source_of(node) -> str:
    return text_at(node.span)


def show(e) -> str:
    """An expression written back with every operation parenthesised."""
    def join(items):
        return ", ".join(map(show, items))

    match e:
        case ast.Name(id=name):
            return name
        case ast.QualName(parts=parts):
            return "/".join(parts)
        case ast.Int() | ast.Float() | ast.Bool() | ast.Str():
            return repr(e.value)
        case ast.BinOp(op=op, left=left, right=right):
            return f"({show(left)} {op} {show(right)})"
        case ast.UnaryOp(op="not", operand=x):
            return f"(not {show(x)})"
        case ast.UnaryOp(op=op, operand=x):
            return f"({op}{show(x)})"
        case ast.Call(func=func, args=args, kwargs=kwargs):
            return f"{show(func)}({join(args + kwargs)})"
        case ast.Keyword(name=name, value=value):
            return f"{name}={show(value)}"
        case ast.Index(value=value, items=items):
            return f"{show(value)}[{join(items)}]"
        case ast.Slice(lo=lo, hi=hi, step=step):
            return ":".join("" if x is None else show(x) for x in (lo, hi, step))
        case ast.EllipsisIndex():
            return "..."
        case ast.Attr(value=value, name=name):
            return f"{show(value)}.{name}"
        case ast.RecordLit(type=type_, fields=fields):
            inits = ", ".join(f"{f.name}: {show(f.value)}" for f in fields)
            return f"{'/'.join(type_)} {{{inits}}}"
        case ast.Lambda(params=params, body=lambda_body):
            return f"(lambda {', '.join(params)}: {show(lambda_body)})"
        case ast.ListLit(items=items):
            return f"[{join(items)}]"
        case ast.TupleLit(items=items):
            return f"({join(items)}{',' if len(items) == 1 else ''})"
    raise AssertionError(f"not an expression: {e!r}")


def show_type(t) -> str:
    """A type expression written back."""
    match t:
        case ast.TensorTypeExpr(dtype=dtype, dims=dims):
            return f"{dtype}[{', '.join(map(show, dims))}]"
        case ast.NamedType(name=name, args=()):
            return "/".join(name)
        case ast.NamedType(name=name, args=args):
            return f"{'/'.join(name)}({', '.join(map(show_type, args))})"
        case ast.TupleTypeExpr(items=items):
            return f"({', '.join(map(show_type, items))}{',' if len(items) == 1 else ''})"


def error(text: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse_text(text)
    str(info.value)                                   # the diagnostic renders
    return info.value


# ---------------------------------------------------------------- whole programs

def test_mlp_example_of_the_language_guide():
    module = parse_text(MLP)
    imports, params, init, logits, loss, step = module.items
    assert isinstance(imports, ast.FromImport) and imports.module == ("nn",)
    assert [n.name for n in imports.names] == ["linear", "cross_entropy"]
    assert imports.span.line == 2                     # the module doc comment documents nothing
    assert [f.name for f in params.fields] == ["C", "W1", "b1", "W2", "b2"]
    assert show(params.fields[1].type.dims[0]) == "(T * E)"
    assert [d.name for d in (init, logits, loss, step)] == ["init", "logits", "loss", "step"]
    assert all(d.doc is None for d in (params, init, logits, loss, step))
    record = init.body[1].value
    assert [f.name for f in record.fields] == ["C", "W1", "b1", "W2", "b2"]
    assert show(record.fields[1].value) == \
        "((normal(k[1], [(T * E), H]) * (5.0 / 3.0)) / sqrt((T * E)))"
    assert show(logits.body[1].value) == "tanh(((reshape(e, [B, (T * E)]) @ p.W1) + p.b1))"
    assert isinstance(step.ret, ast.TupleTypeExpr)
    target = step.body[0].target
    assert isinstance(target, ast.TupleTarget) and [t.name for t in target.items] == ["l", "g"]
    assert show(step.body[0].value) == "value_and_grad(loss, wrt=p)(p, x, y)"
    assert show(step.body[1].value) == "(map((lambda w, d: (w - (lr * d))), p, g), l)"


def test_fold_examples_of_the_language_guide():
    rnn, stack = parse_text(FOLDS).items
    scan = rnn.body[0]
    assert isinstance(scan, ast.Fold) and scan.result == ast.NameTarget("hs", scan.result.span)
    assert (scan.var.name, show(scan.iterable)) == ("x", "xs")
    assert [(s.name, show(s.value)) for s in scan.state] == [("h", "zeros([B, H])")]
    assert [type(s) for s in scan.body] == [ast.Assign, ast.Return]
    unrolled = stack.body[0]
    assert unrolled.result is None and show(unrolled.iterable) == "p.blocks"
    assert [(s.name, show(s.value)) for s in unrolled.state] == [("h", "x")]


def test_bend_example():
    (tree_sum,) = parse_text(BEND).items
    bend, ret = tree_sum.body
    assert isinstance(bend, ast.Bend) and isinstance(ret, ast.Return)
    assert [(s.name, show(s.value)) for s in bend.state] == [("d", "0")]
    assert show(bend.cond) == "(d < depth)"
    assert show(bend.when_body[0].value) == "(fork((d + 1)) + fork((d + 1)))"
    assert show(bend.else_body[0].value) == "x"


def test_adt_definitions_and_fold():
    tree, shape, total = parse_text(ADT).items
    assert (tree.name, tree.params, tree.doc) == ("Tree", ("T",), "A binary tree of static values.")
    node, leaf = tree.ctors
    assert [(f.name, f.recursive) for f in node.fields] == [("left", True), ("right", True)]
    assert node.fields[0].type.name == ("Tree",) and node.fields[0].type.args[0].name == ("T",)
    assert leaf.fields[0].type is None
    rect, circle, empty = shape.ctors
    assert [(f.name, f.type and f.type.name) for f in rect.fields] == [("w", ("f32",)), ("h", None)]
    assert (empty.name, empty.fields) == ("Empty", ())
    fold = total.body[0]
    assert isinstance(fold, ast.AdtFold) and fold.bind is None and show(fold.subject) == "t"
    assert [(s.name, show(s.value)) for s in fold.state] == [("acc", "0")]
    assert [c.ctor for c in fold.cases] == [("Tree", "Node"), ("Tree", "Leaf")]


def test_empty_and_comment_only_files():
    assert parse_text("").items == ()
    assert parse_text("# nothing\n\n#{ at all\n#}").items == ()


def test_file_without_final_newline_and_crlf():
    assert parse_text("def f():\n  return 1").items[0].body[0].value.value == 1
    assert parse_text("def f():\r\n  x = 1\r\n  return x\r\n").items[0].body[1].value.id == "x"


def test_a_parse_after_an_error_starts_afresh():
    error("def f(:\n  (x = [1,\n")
    assert parse_text("def f():\n  return 1\n").items[0].name == "f"


def test_large_program_parses_quickly():
    units = [FOLDS.replace("def rnn", f"def rnn{i}").replace("def stack", f"def stack{i}")
             for i in range(5000 // FOLDS.count("\n") + 1)]
    start = time.process_time()
    module = parse_text("\n".join(units))
    assert len(module.items) == 2 * len(units)
    assert time.process_time() - start < 2.0          # about 0.3 s on a slow core


# ---------------------------------------------------------------- items

def test_def_parameters_types_and_defaults():
    (f,) = parse_text("def f(a: f32[B, 4 * C], b: int = 3, c, d = x + 1) -> bool[]: return a").items
    a, b, c, d = f.params
    assert isinstance(a.type, ast.TensorTypeExpr) and a.type.dtype == "f32"
    assert [show(x) for x in a.type.dims] == ["B", "(4 * C)"]
    assert (b.type.name, b.default.value) == (("int",), 3)
    assert (c.type, c.default) == (None, None)
    assert show(d.default) == "(x + 1)"
    assert f.ret == ast.TensorTypeExpr("bool", (), f.ret.span)


@pytest.mark.parametrize("text, want", [
    ("int", ast.NamedType(("int",), (), None)),
    ("Key", ast.NamedType(("Key",), (), None)),
    ("f32", ast.NamedType(("f32",), (), None)),
    ("Mod/Type", ast.NamedType(("Mod", "Type"), (), None)),
    ("u24[N]", ast.TensorTypeExpr("u24", (ast.Name("N", None),), None)),
])
def test_simple_types(text, want):
    (f,) = parse_text(f"def f(x: {text}):\n  return x\n").items
    got = f.params[0].type
    assert type(got) is type(want)
    assert show_type(got) == show_type(want)


@pytest.mark.parametrize("text", ["List(Block)", "(Params, f32)", "(f32[B], (int, Key))", "(A,)",
                                  "List((A, B))", "f32[T * E, D // H]"])
def test_compound_types(text):
    (f,) = parse_text(f"def f() -> {text}:\n  return 0\n").items
    assert show_type(f.ret) == text.replace("T * E", "(T * E)").replace("D // H", "(D // H)")


def test_object_spans_lines_with_trailing_comma():
    (obj,) = parse_text("object P {\n  W: f32[D, H],\n  b: f32[H],\n}\n").items
    assert [f.name for f in obj.fields] == ["W", "b"]
    assert (obj.name_span.line, obj.name_span.col) == (1, 8)
    assert source_of(obj).endswith("}")


@pytest.mark.parametrize("text, module, names", [
    ("from nn import linear", ("nn",), [("linear", None)]),
    ("from nn import a, b as c", ("nn",), [("a", None), ("b", "c")]),
    ("from lib/nn import relu", ("lib", "nn"), [("relu", None)]),
    ("from lib.nn import relu", ("lib", "nn"), [("relu", None)]),
])
def test_from_import(text, module, names):
    (item,) = parse_text(text + "\n").items
    assert item.module == module
    assert [(n.name, n.alias) for n in item.names] == names
    assert source_of(item) == text


@pytest.mark.parametrize("text, module, alias", [
    ("import nn", ("nn",), None),
    ("import nn as n", ("nn",), "n"),
    ("import a/b as c", ("a", "b"), "c"),
])
def test_import(text, module, alias):
    (item,) = parse_text(text).items
    assert (item.module, item.alias, source_of(item)) == (module, alias, text)


# ---------------------------------------------------------------- doc comments

def test_doc_comment_directly_above_an_item_documents_it():
    text = ("#{ The parameters. #}\nobject P { W: f32[D] }\n"
            "#{\n  Sums a tree.\n#}\ndef f():\n  #{ A helper. #}\n  def g(): return 1\n"
            "  return g()\n"
            "#{ An activation. #}\ntype Act:\n  Relu\n")
    obj, f, act = parse_text(text).items
    assert [obj.doc, f.doc, f.body[0].doc, act.doc] == [
        "The parameters.", "Sums a tree.", "A helper.", "An activation."]


@pytest.mark.parametrize("text", [
    "#{ Not a doc: a blank line follows. #}\n\ndef f(): return 1\n",
    "# a line comment is not a doc\ndef f(): return 1\n",
    "def f(): return '#{ not a comment #}'\n",
])
def test_doc_comment_must_be_a_block_comment_on_the_line_above(text):
    assert parse_text(text).items[0].doc is None


def test_comments_do_not_disturb_indentation():
    stmts = body("x = 1\n#{ a block comment\n     spanning lines #}\n      # a stray comment\n"
                 "y = x #{ inline #} + 1  # trailing\nreturn y")
    assert [type(s) for s in stmts] == [ast.Assign, ast.Assign, ast.Return]
    assert show(stmts[1].value) == "(x + 1)"


# ---------------------------------------------------------------- statements

def test_assignments():
    plain, tup, nested, paren = body("x = 1\na, b = f(x)\n(a, (b, c)) = t\n(x) = 2")
    assert plain.target == ast.NameTarget("x", plain.target.span)
    assert [t.name for t in tup.target.items] == ["a", "b"]
    inner = nested.target.items[1]
    assert isinstance(inner, ast.TupleTarget) and [t.name for t in inner.items] == ["b", "c"]
    assert isinstance(paren.target, ast.NameTarget)


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "@"])
def test_augmented_assignment(op):
    (stmt,) = body(f"x {op}= y")
    assert isinstance(stmt, ast.AugAssign) and (stmt.target.name, stmt.op) == ("x", op)
    assert text_at(stmt.op_span) == f"{op}="


def test_use_return_assert_and_expression_statements():
    use, call, ret_tuple, ret_none, check, check_msg, semi = body(
        'use x = e\nprint(x)\nreturn a, b\nreturn\nassert ok\n'
        'assert D % H == 0, "heads must divide D"\ny = 1;')
    assert (use.name, show(use.value)) == ("x", "e")
    assert isinstance(call, ast.ExprStmt) and show(call.value) == "print(x)"
    assert show(ret_tuple.value) == "(a, b)" and ret_none.value is None
    assert (show(check.cond), check.message) == ("ok", None)
    assert check_msg.message.value == "heads must divide D"
    assert isinstance(semi, ast.Assign)


def test_if_elif_else():
    (stmt,) = body("if a:\n  x = 1\nelif b: x = 2\nelif c:\n  x = 3\nelse:\n  x = 4")
    assert [show(b.cond) for b in stmt.branches] == ["a", "b", "c"]
    assert show(stmt.orelse[0].value) == "4"
    (bare,) = body("if a: return x")
    assert bare.orelse is None and isinstance(bare.branches[0].body[0], ast.Return)
    assert source_of(stmt) == source_of(stmt).rstrip() and source_of(stmt).endswith("x = 4")


def test_switch():
    (plain,) = body("switch n:\n  case 0:\n    return x\n  case 1: return y\n"
                    "  case _:\n    return z")
    assert (plain.bind, show(plain.subject)) == (None, "n")
    assert [c.value for c in plain.cases] == [0, 1, None]
    (bound,) = body("switch n = m - 1:\n  case 0: return 1\n  case _: return n")
    assert (bound.bind, show(bound.subject)) == ("n", "(m - 1)")


def test_match():
    (plain,) = body("match act:\n  case Act/Relu:\n    y = relu(x)\n  case Gelu: y = gelu(x)\n"
                    "  case _: y = x")
    assert [c.ctor for c in plain.cases] == [("Act", "Relu"), ("Gelu",), None]
    (bound,) = body("match a = p.act:\n  case _: return a")
    assert (bound.bind, show(bound.subject)) == ("a", "p.act")


def test_tensor_fold_forms():
    with_state, plain, tuple_result = body(
        "hs = fold x in xs with h = h0, c = 0:\n  h = x + h\n  return h\n"
        "fold x in xs:\n  print(x)\n"
        "a, b = fold x in xs: return x, x")
    assert [s.name for s in with_state.state] == ["h", "c"]
    assert (plain.result, plain.state) == (None, ())
    assert isinstance(tuple_result.result, ast.TupleTarget)
    assert source_of(with_state).startswith("hs = fold")
    assert (with_state.var.span.line, with_state.var.span.col) == (2, 13)


def test_adt_fold_forms():
    plain, bound, stateful = body(
        "fold t:\n  case _: return 0\nfold t = p.tree:\n  case _: return 0\n"
        "fold t with acc = 0, n = 1:\n  case Leaf: return acc")
    assert isinstance(plain, ast.AdtFold) and (plain.bind, show(plain.subject)) == (None, "t")
    assert (bound.bind, show(bound.subject)) == ("t", "p.tree")
    assert [s.name for s in stateful.state] == ["acc", "n"]
    assert stateful.cases[0].ctor == ("Leaf",)


def test_bend_with_several_states_and_one_line_branches():
    (stmt,) = body("bend d = 0, x = x0:\n  when d < 3: y = fork(d + 1, x * 2)\n  else: y = x")
    assert [s.name for s in stmt.state] == ["d", "x"]
    call = stmt.when_body[0].value
    assert isinstance(call, ast.Call) and call.func == ast.Name("fork", call.func.span)


def test_local_def():
    (local, ret) = body("def g(a, b = 2): return a * b\nreturn g(1)")
    assert isinstance(local, ast.Def) and [p.name for p in local.params] == ["a", "b"]


# ---------------------------------------------------------------- expressions

@pytest.mark.parametrize("text, want", [
    ("-x**2", "(-(x ** 2))"),
    ("2**-x", "(2 ** (-x))"),
    ("a ** b ** c", "(a ** (b ** c))"),
    ("a - b - c", "((a - b) - c)"),
    ("x-1", "(x - 1)"),
    ("a + b * c", "(a + (b * c))"),
    ("a @ b + c", "((a @ b) + c)"),
    ("a * b // c % d / e @ f", "(((((a * b) // c) % d) / e) @ f)"),
    ("-a * b", "((-a) * b)"),
    ("- - a", "(-(-a))"),
    ("+a", "a"),
    ("a << 1 + 2", "(a << (1 + 2))"),
    ("a >> b < c", "((a >> b) < c)"),
    ("x > 0 & y <= 1", "((x > 0) & (y <= 1))"),
    ("a | b ^ c & d", "(a | (b ^ (c & d)))"),
    ("a != b | c == d", "((a != b) | (c == d))"),
    ("not a == b", "(not (a == b))"),
    ("not a and b or c", "(((not a) and b) or c)"),
    ("a or b and not c", "(a or (b and (not c)))"),
    ("(a + b) * c", "((a + b) * c)"),
    ("f(x)[0].W ** 2", "(f(x)[0].W ** 2)"),
    ("-p.W @ x", "((-p.W) @ x)"),
    ("p.W/q.x", "(p.W / q.x)"),
    ("lambda a, b: a + b", "(lambda a, b: (a + b))"),
    ("lambda: 0", "(lambda : 0)"),
])
def test_operator_precedence(text, want):
    assert show(expr(text)) == want


@pytest.mark.parametrize("text, want", [
    ("f(a, b, k=v)", "f(a, b, k=v)"),
    ("f(a, b,)", "f(a, b)"),
    ("f()", "f()"),
    ("value_and_grad(loss, wrt=p)(p, x)", "value_and_grad(loss, wrt=p)(p, x)"),
    ("map(lambda w, d: w - d, p, g)", "map((lambda w, d: (w - d)), p, g)"),
    ("x[i]", "x[i]"),
    ("x[:, 0]", "x[::, 0]"),
    ("x[a:b]", "x[a:b:]"),
    ("x[::2]", "x[::2]"),
    ("x[1:]", "x[1::]"),
    ("x[..., -1]", "x[..., (-1)]"),
    ("p.W.T", "p.W.T"),
    ("Params { W: w, b: b }", "Params {W: w, b: b}"),
    ("Shape/Rect { w: 2, h: 3, }", "(Shape / Rect {w: 2, h: 3})"),
    ("Leaf {}", "Leaf {}"),
    ("Act/Relu", "(Act / Relu)"),
    ("[1.0, 2.0]", "[1.0, 2.0]"),
    ("[[1, 2], [3, 4],]", "[[1, 2], [3, 4]]"),
    ("[]", "[]"),
    ("(a, b)", "(a, b)"),
    ("(a,)", "(a,)"),
    ("()", "()"),
    ("((a))", "a"),
    ("True and False", "(True and False)"),
    ("'it' + \"s\"", "('it' + 's')"),
])
def test_postfix_and_atoms(text, want):
    assert show(expr(text)) == want


def test_record_literal_and_slice_nodes():
    record = expr("Shape { w: 2 }")
    assert record.type == ("Shape",) and text_at(record.type_span) == "Shape"
    index = expr("x[:, 1:2:3]")
    assert index.items[0] == ast.Slice(None, None, None, index.items[0].span)
    bounds = index.items[1]
    assert [show(x) for x in (bounds.lo, bounds.hi, bounds.step)] == ["1", "2", "3"]
    assert source_of(index.items[1]) == "1:2:3"
    assert isinstance(expr("x[..., 0]").items[0], ast.EllipsisIndex)


@pytest.mark.parametrize("text, kind, value", [
    ("3", ast.Int, 3), ("0x1F", ast.Int, 31), ("0b101", ast.Int, 5), ("1_000", ast.Int, 1000),
    ("007", ast.Int, 7), ("1.0", ast.Float, 1.0), (".5", ast.Float, 0.5), ("1e-5", ast.Float, 1e-5),
    ("2.", ast.Float, 2.0), ("1_0.2_5E+1", ast.Float, 102.5), ("True", ast.Bool, True),
    ("False", ast.Bool, False), ('"a\\nb\\"c"', ast.Str, 'a\nb"c'), ("'d\\'e'", ast.Str, "d'e"),
])
def test_literals(text, kind, value):
    got = expr(text)
    assert type(got) is kind and got.value == value
    assert source_of(got) == text


@pytest.mark.parametrize("text, want", [
    # `a/b` is a division in expressions (the checker reads it as Bend's qualified name when
    # `a` is a type or module), so it groups like any division
    ("Act/Relu", "(Act / Relu)"),
    ("a/b/c", "((a / b) / c)"),
    ("h/d**0.5", "(h / (d ** 0.5))"),
    ("x/sqrt(d)", "(x / sqrt(d))"),
    ("a*b/c", "((a * b) / c)"),
    ("h/2", "(h / 2)"),
    ("x//y", "(x // y)"),
])
def test_slash_is_division(text, want):
    assert show(expr(text)) == want


def test_qualified_names_in_types_and_patterns():
    (fn,) = parse_text("def f(x: nn/Act) -> f32:\n  match x:\n    case Act/Relu:\n      return 1.0\n").items
    assert fn.params[0].type.name == ("nn", "Act")
    assert fn.body[0].cases[0].ctor == ("Act", "Relu")


def test_fork_is_an_ordinary_name():
    assert show(expr("fork(d + 1, x)")) == "fork((d + 1), x)"


@pytest.mark.parametrize("keyword", ["in", "def", "if", "when", "with", "lambda", "use", "match"])
def test_keywords_are_reserved(keyword):
    error(f"def f():\n  {keyword} = 1\n")


# ---------------------------------------------------------------- spans

def test_spans_point_at_the_source():
    text = "def add(a, b):\n  c = a +  b * 2\n  return f(c, k=1)[0]\n"
    module = parse_text(text)
    (f,) = module.items
    assert (module.span.start, module.span.end) == (0, len(text))
    assert (f.name_span.line, f.name_span.col) == (1, 5) and text_at(f.name_span) == "add"
    assert source_of(f) == text.rstrip()
    assign, ret = f.body
    plus = assign.value
    assert (plus.op_span.line, plus.op_span.col) == (2, 9)
    assert (plus.right.op_span.line, plus.right.op_span.col) == (2, 14)
    assert source_of(plus) == "a +  b * 2"
    assert source_of(ret) == "return f(c, k=1)[0]"
    assert source_of(ret.value.value) == "f(c, k=1)"
    assert source_of(ret.value.value.kwargs[0]) == "k=1"
    assert (ret.value.span.line, ret.value.span.col) == (3, 10)


def test_parenthesised_expressions_span_their_parentheses():
    e = expr("(a + b) * c")
    assert source_of(e) == "(a + b) * c" and source_of(e.left) == "(a + b)"
    assert source_of(expr("lambda a: (a, a)")) == "lambda a: (a, a)"


# ---------------------------------------------------------------- errors

def where(err: ParseError) -> tuple[int, int]:
    return err.span.line, err.span.col


def test_tab_in_indentation():
    err = error("def f():\n  x = 1\n \treturn x\n")
    assert err.message == "tab in indentation; indent with spaces" and where(err) == (3, 2)
    assert where(error("\tdef f(): return 1\n")) == (1, 1)


def test_tab_elsewhere_is_whitespace():
    assert parse_text("def f(a,\tb):\n  return a\t+ b\n").items[0].name == "f"


def test_inconsistent_dedent():
    err = error("def f():\n  if x:\n      y = 1\n    z = 2\n")
    assert err.message == "unindent does not match any outer indentation level"
    assert where(err) == (4, 5)


def test_unexpected_indent():
    err = error("def f():\n  x = 1\n    y = 2\n")
    assert err.message == "unexpected indent" and where(err) == (3, 5)


def test_unclosed_bracket_points_at_the_bracket():
    err = error("def f():\n  x = g(1,\n  return x\n")
    assert err.message == "unclosed '('" and where(err) == (2, 8)
    (note,) = err.diagnostics[0].notes
    assert note.message == "expected ')' before 'return'" and (note.span.line, note.span.col) == (3, 3)
    at_end = error("object P { W: f32[D]")
    assert at_end.message == "unclosed '{'" and where(at_end) == (1, 10)
    assert at_end.diagnostics[0].notes[0].message == "expected '}' before end of file"


def test_unexpected_token():
    err = error("def f():\n  return (1 + 2))\n")
    assert err.message.startswith("unexpected ')'") and where(err) == (2, 17)
    err = error("def f():\n  f(a b)\n")
    assert err.message.startswith("unexpected name 'b'; expected ')', ','")


def test_end_of_file():
    err = error("def f():")
    assert err.message == "expected an indented block" and where(err) == (1, 9)
    err = error("def f():\n  return x *")
    assert err.message == "unexpected end of file; expected an expression" and where(err) == (2, 13)
    err = error("def f():\n  bend d = 0:\n    when d < 3:\n      y = 1\n")
    assert "expected 'else'" in err.message


def test_missing_colon():
    err = error("def f(x: f32[N]) -> f32[N]\n  return x\n")
    assert err.message == "expected ':'" and where(err) == (1, 27)
    err = error("def f():\n  if x\n    y = 1\n")
    assert err.message == "expected ':'" and where(err) == (2, 7)


@pytest.mark.parametrize("text, message, line, col", [
    ("def f():\n  x = $\n", "unexpected character '$'", 2, 7),
    ("def f():\n  x = 'abc\n", "unterminated string", 2, 7),
    ("def f(): return x * 0xZZ\n", "invalid number '0xZZ'", 1, 21),
    ("def f(): return 1.5e-\n", "invalid number '1.5e'", 1, 17),
    ("def f(): return 2x\n", "invalid number '2x'", 1, 17),
    ("#{ never closed\ndef f(): return 1\n", "unclosed '#{' comment", 1, 1),
    ("def f(): return 0 < x < 3\n", "comparisons cannot be chained; use 'and'", 1, 23),
    ("def f(): return a == not b\n", "put 'not …' in parentheses here", 1, 22),
    ("def f(): g(k=1, 2)\n", "positional argument after a keyword argument", 1, 17),
    ("def f(): x[0] = 1\n", "cannot assign to an element: tensors are immutable", 1, 10),
    ("def f(): f(x) = 1\n", "cannot assign to this expression", 1, 10),
    ("def f(): p.W += 1\n", "'+=' needs a single name on its left", 1, 10),
    ("def f():\n  switch n:\n    case A: return 1\n", "a switch case is an integer or '_'", 3, 10),
    ("x = 1\n", "unexpected name 'x'; expected a def, type, object or import", 1, 1),
])
def test_error_messages(text, message, line, col):
    err = error(text)
    assert err.message.startswith(message) and where(err) == (line, col)


# ---------------------------------------------------------------- fuzzing

SEEDS = [MLP, FOLDS, BEND, ADT]
ALPHABET = st.sampled_from([*":()[]{}\n \t#\"'=+-*/@<>!.,;~_a1", "#{", "#}", "\n  ", "def ", "case "])


@st.composite
def mutated_programs(draw):
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 8)))
        match draw(st.sampled_from(["delete", "insert", "swap", "truncate"])):
            case "delete":
                text = text[:i] + text[j:]
            case "insert":
                text = text[:i] + draw(ALPHABET) + text[i:]
            case "swap" if j < len(text):
                text = text[:i] + text[j] + text[i + 1:j] + text[i] + text[j + 1:]
            case "truncate":
                text = text[:i]
    return text


def parses_or_reports(text: str) -> None:
    try:
        assert isinstance(parse_text(text), ast.Module)
    except ParseError as err:
        str(err)                                      # the diagnostic renders
        assert 0 <= err.span.start <= err.span.end <= len(text)


FUZZ = settings(max_examples=400, deadline=timedelta(seconds=1),
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(mutated_programs())
def test_mutated_programs_parse_or_raise_parse_error(text):
    parses_or_reports(text)


@FUZZ
@given(st.text())
def test_random_text_parses_or_raises_parse_error(text):
    parses_or_reports(text)


@FUZZ
@given(st.binary())
def test_random_bytes_parse_or_raise_parse_error(data):
    parses_or_reports(data.decode("utf-8", errors="replace"))
