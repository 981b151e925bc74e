"""Frontend for XLA HLO text (`.hlo`): an HloModule as XLA and JAX print it, read by a small lexer
and a recursive-descent parser, then mapped onto the op registry.

Text. `HloModule name[, attribute=value]*`, then computations `[ENTRY] name [(p: shape, ...) ->
shape] { instruction* }`, an instruction being `[ROOT] name = shape opcode(operands)[,
attribute=value]*`. Names are written with or without `%`. A shape is `f32[2,3]`, its layout
`{1,0}` (with any tiling or memory-space suffix) skipped: the graph holds every tensor row-major.
A tuple shape is `(f32[], s32[2])`. Operands may carry their shape (`f32[2] %x`, older printers).
An attribute value is read as raw text, a balanced `{...}`, a string or a bare word, and only
the attributes an opcode needs are interpreted; the rest (`metadata`, `sharding`,
`frontend_attributes`, `backend_config`, `entry_computation_layout`, ...) are skipped. `//` and
`/* */` comments are skipped. The ENTRY computation is the one marked so, else the last; its ROOT
the instruction marked so, else the last.

Graph. The entry's parameters are the graph's inputs, named as their instructions without `%`
(`Arg_0.1`); its ROOT is the output, under the ROOT's name (a tuple ROOT: one output per element,
`<root>.0`, `<root>.1`, ..., nested tuples `<root>.1.0`). `fusion` (`calls=`) and `call`
(`to_apply=`) computations are inlined, their tensors named `<caller>.<name>`, up to MAX_INLINED
instructions in all (counted before inlining); a `reduce`'s `to_apply` computation must be one
add, multiply, maximum or minimum (or, and for pred) of its two parameters. `constant` and
`iota` become graph constants with their values, so `--check` runs on them. An op whose operands
are all constants is folded into a constant with the registry's reference (a RESHAPE of any size,
the rest up to FOLD_LIMIT elements), so `convert(constant(8))` is the number 8 to the passes that
look for it.

HLO's `broadcast` is not materialised: its operand is RESHAPEd (or TRANSPOSEd) to the result's
rank with size-1 dims and the map ops that read it broadcast as numpy does. Such a value carries
its HLO shape beside its tensor's; an op that needs the whole tensor (a layout op, a contraction,
a reduction, a graph output) gets it made by a MUL with ones over the broadcast dims. Layout
helpers compose (a RESHAPE of a RESHAPE reads the first one's operand, a TRANSPOSE of a TRANSPOSE
composes the permutations), identical ops are made once, and ops no output needs are dropped.

Mapping (to the registry's names; the tables below): elementwise ops one to one; `compare` to EQUAL /
LESS / ..., NE as 1 - EQUAL; `dot` to TRANSPOSE and RESHAPE of each operand into [batch..., M, K]
and [batch..., K, N], a MATMUL and a RESHAPE to the HLO result; `convolution` with two spatial
dims to CONV2D NHWC/OHWI between TRANSPOSEs; `reduce` to REDUCE_* with keepdims false, then the
init value combined in unless it is the reduction's identity; `slice` to SLICE (and GATHER along
a strided dim); `pad` to PAD (SLICE first for negative padding); `convert` to CAST (to pred:
x != 0). pred is held as u8 0/1, as the `.dfg` frontend holds i1. Where HLO restates a type, the
declared one must be what the op makes: the operands' element type (SAME_ELEMENT; pred for
compare), and for the ops that make a whole tensor (WHOLE) its shape exactly. Errors are one line,
"<file>:<line>: <reason>", the line the instruction (or the token) is on.
"""

from __future__ import annotations

import bisect
import heapq
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from dfx import dtypes
from dfx.graph import MAX_RANK, Graph, Op, Tensor, shape_problem
from dfx.ops import REGISTRY, ShapeError, lookup, reduction

from ..errors import CompileError

# ---- element types ---------------------------------------------------------------------------

# HLO element type -> DFX dtype. pred is a byte holding 0 or 1 (DFX has no 1-bit type).
ELEMENT_TYPES = {"pred": "u8", "s8": "i8", "s16": "i16", "s32": "i32", "u8": "u8", "f16": "f16",
                 "bf16": "bf16", "f32": "f32", "f64": "f64", "f8e4m3fn": "f8"}
# the other element types XLA prints: they parse, and an instruction of one is refused by name
OTHER_ELEMENT_TYPES = frozenset({
    "s1", "s2", "s4", "s64", "u1", "u2", "u4", "u16", "u32", "u64", "c64", "c128", "f4e2m1fn", "f8e3m4", "f8e4m3",
    "f8e4m3b11fnuz", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz", "f8e8m0fnu", "token", "opaque",
})
ALL_ELEMENT_TYPES = frozenset(ELEMENT_TYPES) | OTHER_ELEMENT_TYPES

FOLD_LIMIT = 1 << 16  # elements of a folded constant (a RESHAPE of a constant folds at any size)
MAX_MADE_CONSTANT = 1 << 24  # elements of a constant the frontend makes (iota, ones to materialise a broadcast)
MAX_CALL_DEPTH = 64  # fusions and calls inlined inside each other
# instructions the inlined fusions and calls may add up to: each calls the next twice, thirty deep,
# is a billion from a few lines; a quarter of a million is more than a large model's module holds
# and still compiles in minutes. Counted before inlining, so a refusal costs nothing
MAX_INLINED = 1 << 18
MAX_TUPLE_DEPTH = 32  # tuple shapes inside each other
MAX_INT_DIGITS = 18

# ---- the opcode tables -----------------------------------------------------------------------

UNARY = {"exponential": "EXP", "log": "LOG", "rsqrt": "RSQRT", "sqrt": "SQRT", "tanh": "TANH",
         "logistic": "SIGMOID", "erf": "ERF", "negate": "NEGATE", "abs": "ABS"}
BINARY = {"add": "ADD", "subtract": "SUB", "multiply": "MUL", "divide": "DIV", "maximum": "MAXIMUM",
          "minimum": "MINIMUM", "power": "POW"}
# pred only: 0/1 bytes, where and is a product and or a maximum
PRED_BINARY = {"and": "MUL", "or": "MAXIMUM"}
# the map ops that keep 0/1 operands 0 or 1: the others (add, subtract, ...) may not make a pred
PRED_CLOSED = frozenset({"MUL", "MAXIMUM", "MINIMUM", "SELECT"})
# compare's direction -> the registry's comparison; NE is 1 - EQUAL
COMPARISONS = {"EQ": "EQUAL", "LT": "LESS", "LE": "LESS_EQUAL", "GT": "GREATER", "GE": "GREATER_EQUAL", "NE": "EQUAL"}
# a reduce's to_apply root -> (the REDUCE_* op, the map op that combines an init value in)
REDUCERS = {"add": ("REDUCE_SUM", "ADD"), "multiply": ("REDUCE_PROD", "MUL"), "maximum": ("REDUCE_MAX", "MAXIMUM"),
            "minimum": ("REDUCE_MIN", "MINIMUM"), "or": ("REDUCE_MAX", "MAXIMUM"), "and": ("REDUCE_MIN", "MINIMUM")}
# opcodes whose result has the element type of their operands, which share one (select's and
# clamp's all but the predicate): HLO restates it, and a result declared of another type is not
# what the op makes (no op converts but convert). compare's result is pred.
SAME_ELEMENT = frozenset({*UNARY, *BINARY, *PRED_BINARY, "not", "select", "clamp", "compare", "copy", "broadcast",
                          "reshape", "transpose", "slice", "concatenate", "pad", "reduce"})
# opcodes XLA defines on floating-point operands only (its shape inference refuses an integer one)
FLOAT_ONLY = frozenset({"exponential", "log", "rsqrt", "sqrt", "tanh", "logistic", "erf"})
# opcodes whose value is a whole tensor (never a broadcast left to its readers): its shape must
# be the declared one exactly
WHOLE = frozenset({"reshape", "bitcast", "transpose", "slice", "concatenate", "pad", "reduce", "dot", "convolution"})
# the attribute naming the computation each inlined opcode calls
CALLS = {"fusion": "calls", "call": "to_apply"}
assert all(op in REGISTRY for table in (UNARY, BINARY, PRED_BINARY, COMPARISONS) for op in table.values())
assert all(op in REGISTRY for pair in REDUCERS.values() for op in pair)


# ---- lexer -----------------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_](?:[A-Za-z0-9_.]|-(?!>))*")
_NUMBER = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_SPACE = re.compile(r"(?:[ \t\r\n]+|//[^\n]*|/\*.*?\*/)*", re.S)
_INT = re.compile(r"-?[0-9]+")
_LAYOUT_START = re.compile(r"\{[ \t]*[0-9:}]")


@dataclass(frozen=True)
class _Token:
    kind: str  # ident | name (written with %) | number | string | -> | eof | the punctuation character
    text: str  # a name without its %, a string without its quotes
    start: int


class _Lexer:
    """Tokens on demand, with one of lookahead; `raw` reads an attribute value as text instead."""

    def __init__(self, file: str, text: str):
        self.file, self.text, self.pos = file, text, 0
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self.peeked: _Token | None = None

    def line(self, pos: int) -> int:
        return bisect.bisect_left(self.newlines, pos) + 1

    def fail(self, pos: int, reason: str) -> CompileError:
        return CompileError(_one_line(f"{self.file}:{self.line(pos)}: {reason}"))

    # -- tokens

    def peek(self) -> _Token:
        if self.peeked is None:
            self.peeked = self._lex()
        return self.peeked

    def next(self) -> _Token:
        token = self.peek()
        self.peeked = None
        return token

    def accept(self, kind: str) -> _Token | None:
        return self.next() if self.peek().kind == kind else None

    def accept_word(self, word: str) -> bool:
        token = self.peek()
        if token.kind == "ident" and token.text == word:
            self.next()
            return True
        return False

    def expect(self, kind: str, what: str) -> _Token:
        token = self.next()
        if token.kind != kind:
            raise self.fail(token.start, f"expected {what}, got {_describe(token)}")
        return token

    def name(self, what: str) -> _Token:
        token = self.next()
        if token.kind not in ("ident", "name"):
            raise self.fail(token.start, f"expected {what}, got {_describe(token)}")
        return token

    def _skip(self) -> None:
        self.pos = _SPACE.match(self.text, self.pos).end()
        if self.text.startswith("/*", self.pos):
            raise self.fail(self.pos, "unterminated comment '/*'")

    def _lex(self) -> _Token:
        self._skip()
        text, start = self.text, self.pos
        if start >= len(text):
            return _Token("eof", "", start)
        c = text[start]
        if c == "%":
            m = _IDENT.match(text, start + 1)
            if not m:
                raise self.fail(start, "expected a name after '%'")
            self.pos = m.end()
            return _Token("name", m.group(), start)
        m = _IDENT.match(text, start)
        if m:
            self.pos = m.end()
            return _Token("ident", m.group(), start)
        if text.startswith("->", start):
            self.pos = start + 2
            return _Token("->", "->", start)
        for special in ("-inf", "-nan"):
            if text.startswith(special, start) and not _IDENT.match(text, start + 4):
                self.pos = start + 4
                return _Token("number", special, start)
        m = _NUMBER.match(text, start)
        if m:
            self.pos = m.end()
            return _Token("number", m.group(), start)
        if c in "\"'":
            self.pos = self._string_end(start)
            return _Token("string", text[start + 1:self.pos - 1], start)
        self.pos = start + 1
        return _Token(c, c, start)

    def _string_end(self, start: int) -> int:
        quote, i = self.text[start], start + 1
        while i < len(self.text):
            if self.text[i] == "\\":
                i += 2
            elif self.text[i] == quote:
                return i + 1
            else:
                i += 1
        raise self.fail(start, "unterminated string")

    # -- raw text

    def _unpeek(self) -> None:
        if self.peeked is not None:
            self.pos, self.peeked = self.peeked.start, None

    def raw(self, what: str) -> tuple[str, int]:
        """An attribute value as text: `{...}` (balanced, strings skipped), a string, or a bare
        word (brackets balanced); (text, line)."""
        self._unpeek()
        self._skip()
        start = self.pos
        c = self.text[start] if start < len(self.text) else ""
        if c == "{":
            end = self._balanced(start, what)
        elif c and c in "\"'":
            end = self._string_end(start)
        else:
            end, depth = start, 0
            while end < len(self.text):
                ch = self.text[end]
                if ch in "[(":
                    depth += 1
                elif ch in "])" and depth:
                    depth -= 1
                elif ch in ",)}" or ch.isspace():
                    break
                end += 1
            if end == start:
                raise self.fail(start, f"{what}: missing value")
        self.pos = end
        return self.text[start:end], self.line(start)

    def skip_layout(self, rank: int) -> bool:
        """Skip a shape's layout, `{1,0}` or `{1,0:T(8,128)S(1)}`, if one follows: braces opening on
        a digit, ':' or '}' (a computation's body opens on a name). Whether it is the row-major one
        (minor-to-major `rank-1, ..., 0`, or none given): the only one a reshape reads as the
        frontend does."""
        self._unpeek()
        self._skip()
        if not _LAYOUT_START.match(self.text, self.pos):
            return True
        start = self.pos
        self.pos = self._balanced(start, "a layout")
        order = self.text[start + 1:self.pos - 1].split(":")[0].replace(" ", "")
        return order in ("", ",".join(str(d) for d in reversed(range(rank))))

    def _balanced(self, start: int, what: str) -> int:
        depth, i = 0, start
        while i < len(self.text):
            ch = self.text[i]
            if ch in "\"'":
                i = self._string_end(i)
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise self.fail(start, f"unterminated '{{' in {what}")


def _describe(token: _Token) -> str:
    if token.kind == "eof":
        return "the end of the file"
    return f"'{_clip(token.text)}'"


def _clip(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _one_line(message: str) -> str:
    return " ".join(message.splitlines())


# ---- parser ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    element: str  # the HLO element type: f32, pred, ...
    dims: tuple[int, ...]
    # its layout is row-major: elsewhere a layout only places bytes, but a bitcast between
    # layouts moves elements (XLA's view of the same bytes), which a reshape does not
    row_major: bool = field(default=True, compare=False)

    def __str__(self) -> str:
        return f"{self.element}[{','.join(map(str, self.dims))}]"


_Type = Any  # a _Shape, or a tuple of _Type


def _type_text(t: _Type) -> str:
    return str(t) if isinstance(t, _Shape) else f"({', '.join(_type_text(e) for e in t)})"


@dataclass
class _Instr:
    name: str
    line: int
    position: int  # in its computation
    type: _Type
    opcode: str
    operands: list[str]
    attrs: dict[str, tuple[str, int]]  # name -> (raw text, line)
    root: bool = False
    literal: Any = None  # constant: a number's text, or nested lists of them
    index: int | None = None  # parameter(index)


@dataclass
class _Computation:
    name: str
    line: int
    entry: bool
    instrs: dict[str, _Instr] = field(default_factory=dict)
    root: _Instr | None = None


@dataclass
class _Module:
    name: str
    computations: dict[str, _Computation]
    entry: _Computation


class _Parser:
    def __init__(self, file: str, text: str):
        self.lex = _Lexer(file, text)

    def fail(self, pos: int, reason: str) -> CompileError:
        return self.lex.fail(pos, reason)

    def module(self) -> _Module:
        lex = self.lex
        head = lex.next()
        if head.kind != "ident" or head.text != "HloModule":
            raise self.fail(head.start, f"expected 'HloModule <name>' first, got {_describe(head)}")
        name = lex.name("the module's name").text
        while lex.accept(","):
            self.attribute(f"module '{name}'")
        computations: dict[str, _Computation] = {}
        while lex.peek().kind != "eof":
            comp = self.computation()
            if comp.name in computations:
                raise CompileError(f"{lex.file}:{comp.line}: computation '{_clip(comp.name)}' is defined twice "
                                   f"(first on line {computations[comp.name].line})")
            computations[comp.name] = comp
        if not computations:
            raise self.fail(len(lex.text), f"module '{_clip(name)}' has no computations")
        entries = [c for c in computations.values() if c.entry]
        if len(entries) > 1:
            raise CompileError(f"{lex.file}:{entries[1].line}: a second ENTRY computation "
                               f"'{_clip(entries[1].name)}' (the first is on line {entries[0].line})")
        entry = entries[0] if entries else list(computations.values())[-1]
        return _Module(name, computations, entry)

    def attribute(self, where: str) -> tuple[str, str, int]:
        lex = self.lex
        key = lex.name(f"an attribute name in {where}")
        lex.expect("=", f"'=' after '{_clip(key.text)}'")
        text, line = lex.raw(f"attribute '{_clip(key.text)}'")
        return key.text, text, line

    def computation(self) -> _Computation:
        lex = self.lex
        entry = lex.accept_word("ENTRY")
        head = lex.name("a computation name (or 'ENTRY')")
        comp = _Computation(head.text, lex.line(head.start), entry)
        if lex.accept("("):  # the signature: parameters' names and shapes, then the result's
            if not lex.accept(")"):
                while True:
                    lex.name("a parameter name")
                    lex.expect(":", "':' after a parameter name")
                    self.type()
                    if lex.accept(")"):
                        break
                    lex.expect(",", "',' or ')' in the parameter list")
            lex.expect("->", "'->' after the parameter list")
            self.type()
        lex.expect("{", f"'{{' to open computation '{_clip(comp.name)}'")
        while not lex.accept("}"):
            if lex.peek().kind == "eof":
                raise self.fail(head.start, f"computation '{_clip(comp.name)}' is not closed with '}}'")
            self.instruction(comp)
        while lex.accept(","):  # execution_thread="..."
            self.attribute(f"computation '{comp.name}'")
        if not comp.instrs:
            raise CompileError(f"{lex.file}:{comp.line}: computation '{_clip(comp.name)}' has no instructions")
        if comp.root is None:
            comp.root = list(comp.instrs.values())[-1]
        return comp

    def instruction(self, comp: _Computation) -> None:
        lex = self.lex
        root = lex.accept_word("ROOT")
        head = lex.name("an instruction name")
        line = lex.line(head.start)
        lex.expect("=", f"'=' after '{_clip(head.text)}'")
        type_ = self.type()
        opcode = lex.expect("ident", "an opcode")
        ins = _Instr(head.text, line, len(comp.instrs), type_, opcode.text, [], {}, root)
        lex.expect("(", f"'(' after the opcode '{_clip(opcode.text)}'")
        if ins.opcode == "constant":
            ins.literal = self.literal(0)
            lex.expect(")", "')' after the constant's value")
        elif ins.opcode == "parameter":
            number = lex.expect("number", "the parameter's number")
            ins.index = self.int(number, "parameter number")
            lex.expect(")", "')' after the parameter's number")
        elif not lex.accept(")"):
            while True:
                ins.operands.append(self.operand())
                if lex.accept(")"):
                    break
                lex.expect(",", "',' or ')' between operands")
        while lex.accept(","):
            key, text, at = self.attribute(f"instruction '{ins.name}'")
            if key in ins.attrs:
                raise CompileError(f"{lex.file}:{at}: '{_clip(ins.name)}': attribute '{_clip(key)}' is given twice")
            ins.attrs[key] = (text, at)
        if ins.name in comp.instrs:
            raise CompileError(f"{lex.file}:{line}: '{_clip(ins.name)}' is defined twice in computation "
                               f"'{_clip(comp.name)}' (first on line {comp.instrs[ins.name].line})")
        if root:
            if comp.root is not None:
                raise CompileError(f"{lex.file}:{line}: a second ROOT in computation '{_clip(comp.name)}' "
                                   f"(the first is on line {comp.root.line})")
            comp.root = ins
        comp.instrs[ins.name] = ins

    def operand(self) -> str:
        lex = self.lex
        token = lex.peek()
        if token.kind == "(" or (token.kind == "ident" and token.text in ALL_ELEMENT_TYPES
                                 and lex.text.startswith("[", lex.pos)):
            self.type()  # an operand written with its shape
        return lex.name("an operand name").text

    def type(self, depth: int = 0) -> _Type:
        lex = self.lex
        if lex.peek().kind == "(":
            if depth >= MAX_TUPLE_DEPTH:
                raise self.fail(lex.peek().start, f"tuple shapes nested deeper than {MAX_TUPLE_DEPTH} levels")
            lex.next()
            elements: list[_Type] = []
            if not lex.accept(")"):
                while True:
                    elements.append(self.type(depth + 1))
                    if lex.accept(")"):
                        break
                    lex.expect(",", "',' or ')' in a tuple shape")
            return tuple(elements)
        token = lex.next()
        if token.kind != "ident" or token.text not in ALL_ELEMENT_TYPES:
            raise self.fail(token.start, f"expected a shape such as f32[2,3], got {_describe(token)}")
        lex.expect("[", f"'[' after the element type '{token.text}'")
        dims: list[int] = []
        if not lex.accept("]"):
            while True:
                dim = lex.next()
                if dim.kind in ("?", "<"):
                    raise self.fail(dim.start, "dynamic dimensions ('?', '<=N') are not supported")
                if dim.kind != "number":
                    raise self.fail(dim.start, f"expected a dimension, got {_describe(dim)}")
                size = self.int(dim, "dimension")
                if size < 0:
                    raise self.fail(dim.start, f"negative dimension {size}")
                dims.append(size)
                if lex.accept("]"):
                    break
                lex.expect(",", "',' or ']' between dimensions")
        row_major = lex.skip_layout(len(dims))
        problem = shape_problem(dims)
        if problem:
            raise self.fail(token.start, f"shape {token.text}{dims}: {problem}")
        return _Shape(token.text, tuple(dims), row_major)

    def int(self, token: _Token, what: str) -> int:
        if not _INT.fullmatch(token.text) or len(token.text.lstrip("-")) > MAX_INT_DIGITS:
            raise self.fail(token.start, f"bad {what} '{_clip(token.text)}'")
        return int(token.text)

    def literal(self, depth: int) -> Any:
        """A constant's value: a number, inf, nan, true or false, or `{...}` of values."""
        lex = self.lex
        token = lex.next()
        if token.kind == "{":
            if depth > MAX_RANK:
                raise self.fail(token.start, f"constant nested deeper than a tensor's {MAX_RANK} dimensions")
            items: list[Any] = []
            if lex.accept("}"):
                return items
            while True:
                items.append(self.literal(depth + 1))
                if lex.accept("}"):
                    return items
                lex.expect(",", "',' or '}' in the constant")
        if token.kind == "number":
            return token.text
        if token.kind == "ident" and token.text in ("inf", "nan", "true", "false"):
            if token.text == "nan" and lex.peek().kind == "(":  # nan(0x7fc00000): the payload is dropped
                lex.next()
                while not lex.accept(")"):
                    if lex.next().kind == "eof":
                        raise self.fail(token.start, "unterminated NaN payload")
            return token.text
        if token.kind == ".":
            raise self.fail(token.start, "the constant's values are elided ('{...}'): print the module with "
                                         "its large constants")
        if token.kind == "(":
            raise self.fail(token.start, "tuple constants are not supported")
        raise self.fail(token.start, f"expected a constant value, got {_describe(token)}")


# ---- attribute values ------------------------------------------------------------------------

_INT_LIST = re.compile(r"\{\s*(?:-?[0-9]+\s*(?:,\s*-?[0-9]+\s*)*)?\}")
_SLICE_DIM = re.compile(r"\[\s*(-?[0-9]+)\s*:\s*(-?[0-9]+)\s*(?::\s*(-?[0-9]+)\s*)?\]")
_PAD_DIM = re.compile(r"(-?[0-9]+)_(-?[0-9]+)(?:_(-?[0-9]+))?")
_DXD = re.compile(r"[0-9]+(?:x[0-9]+)*")
_DIM_LABELS = re.compile(r"([0-9bf]+)_([0-9io]+)->([0-9bf]+)")


def _int(text: str) -> int | None:
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else None


def _ints(text: str) -> list[int] | None:
    """`{1,0}` -> [1, 0]; None when the text is not such a list (or a number is too long)."""
    if not _INT_LIST.fullmatch(text):
        return None
    values = [_int(v) for v in re.findall(r"-?[0-9]+", text)]
    return None if None in values else values  # type: ignore[return-value]


# ---- values ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Value:
    """An HLO array value: the graph tensor holding it, and its HLO shape. The tensor's shape
    broadcasts to `shape` as numpy's does (right-aligned, size-1 dims stretched): equal to it,
    or smaller where a broadcast was left to the ops that read it."""

    tensor: str
    shape: tuple[int, ...]
    dtype: str


_Any = Any  # a _Value, or a tuple of them (an HLO tuple)


def _broadcastable(small: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    if len(small) > len(shape):
        return False
    return all(s in (1, d) for s, d in zip(small[::-1], shape[::-1]))


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


class _Builder:
    """From the parsed module to the graph: the entry computation's instructions in dependency
    order, each by its opcode's handler (`HANDLERS`)."""

    def __init__(self, file: str, module: _Module, warnings: list[str]):
        self.file, self.module, self.warnings = file, module, warnings
        self.graph = Graph(module.name)
        self.producer: dict[str, Op] = {}
        self.readers: dict[str, list[Op]] = {}  # tensor -> the ops reading it
        self.op_names: set[str] = set()
        self.cse: dict[tuple, str] = {}  # (op, inputs, attrs, dtype) -> the tensor already made so
        self.ones: dict[tuple, str] = {}  # (shape, dtype) -> a constant of ones
        self.reserved = set(module.entry.instrs)  # names helpers never take: the entry's own
        self.prefix = ""  # "<caller>." inside an inlined computation
        self.calls: list[str] = []  # the computations being inlined, outermost first
        self.sizes: dict[str, int] = {}  # computation -> the instructions inlining it makes
        self.inlined = 0  # instructions the calls inlined so far make
        self.input_lines: dict[str, int] = {}

    def fail(self, ins: _Instr, reason: str) -> CompileError:
        return CompileError(_one_line(f"{self.file}:{ins.line}: {reason}"))

    def where(self, ins: _Instr) -> str:
        return f"{ins.opcode} '{_clip(ins.name)}'"

    # -- the graph

    def build(self) -> Graph:
        entry = self.module.entry
        params = sorted((i for i in entry.instrs.values() if i.opcode == "parameter"), key=lambda i: i.index)
        args: dict[int, _Any] = {}
        for ins in params:
            if ins.index in args:
                raise self.fail(ins, f"parameter({ins.index}) is given twice in the ENTRY computation")
            if not isinstance(ins.type, _Shape):
                raise self.fail(ins, f"parameter '{_clip(ins.name)}': tuple-shaped parameters are not supported")
            dtype = self.dtype(ins, ins.type)
            self.graph.tensors[ins.name] = Tensor(ins.name, ins.type.dims, dtype, "input")
            self.input_lines[ins.name] = ins.line
            args[ins.index] = _Value(ins.name, ins.type.dims, dtype)
        root = entry.root
        if root.opcode == "parameter":
            raise self.fail(root, f"the ROOT '{_clip(root.name)}' is a parameter: the module computes nothing")
        value = self.computation(entry, args)
        self.finish(root, list(_flatten(root.name, value)))
        return self.graph

    def computation(self, comp: _Computation, args: dict[int, _Any]) -> _Any:
        values: dict[str, _Any] = {}
        for ins in self.order(comp):
            if ins.opcode == "parameter":
                if ins.index not in args:
                    raise self.fail(ins, f"parameter({ins.index}) of computation '{_clip(comp.name)}' has no "
                                         f"argument ({len(args)} given)")
                value = args[ins.index]
            else:
                handler = HANDLERS.get(ins.opcode)
                if handler is None:
                    raise self.fail(ins, f"'{_clip(ins.name)}': HLO op '{_clip(ins.opcode)}' is not supported")
                if ins.opcode == "bitcast" and not all(t.row_major for t in [ins.type, *(
                        comp.instrs[o].type for o in ins.operands if o in comp.instrs)] if isinstance(t, _Shape)):
                    raise self.fail(ins, f"{self.where(ins)}: a bitcast between layouts other than row-major "
                                         f"moves elements as a transpose would; only a row-major bitcast (a "
                                         f"reshape) is supported")
                self.check_element(ins, [comp.instrs[o].type for o in ins.operands])
                value = handler(self, ins, [values[o] for o in ins.operands])
            self.check(ins, value, [comp.instrs[o].type for o in ins.operands])
            values[ins.name] = value
        return values[comp.root.name]

    def order(self, comp: _Computation) -> list[_Instr]:
        """The instructions the root needs, each after its operands, ties in text order."""
        needed, stack = {comp.root.name}, [comp.root]
        while stack:
            ins = stack.pop()
            for o in ins.operands:
                if o not in comp.instrs:
                    raise self.fail(ins, f"'{_clip(ins.name)}': operand '{_clip(o)}' is not defined in "
                                         f"computation '{_clip(comp.name)}'")
                if o not in needed:
                    needed.add(o)
                    stack.append(comp.instrs[o])
        waiting = {n: {o for o in comp.instrs[n].operands} for n in needed}
        readers: dict[str, list[str]] = {}
        for n, ops in waiting.items():
            for o in ops:
                readers.setdefault(o, []).append(n)
        ready = sorted((comp.instrs[n].position, n) for n, ops in waiting.items() if not ops)
        order: list[_Instr] = []
        heapq.heapify(ready)
        while ready:
            _, n = heapq.heappop(ready)
            order.append(comp.instrs[n])
            for r in readers.get(n, []):
                waiting[r].discard(n)
                if not waiting[r]:
                    heapq.heappush(ready, (comp.instrs[r].position, r))
        if len(order) < len(needed):
            stuck = min((comp.instrs[n] for n in needed if waiting[n]), key=lambda i: i.position)
            raise self.fail(stuck, f"'{_clip(stuck.name)}' is on a cycle of operands")
        return order

    def check_element(self, ins: _Instr, operands: list[_Type]) -> None:
        """An op of SAME_ELEMENT declares the element type its operands give it."""
        if ins.opcode not in SAME_ELEMENT or not isinstance(ins.type, _Shape):
            return  # the handler refuses a tuple where an array is needed
        shapes = [t for t in operands if isinstance(t, _Shape)]
        predicate = shapes[:1] if ins.opcode == "select" else []
        data = shapes[1:] if ins.opcode == "select" else shapes
        made = _made(ins, operands)
        if any(t.element != "pred" for t in predicate):
            raise self.fail(ins, f"{self.where(ins)}: {made}: the predicate (operand 0) must be pred")
        elements = list(dict.fromkeys(t.element for t in data))
        if len(elements) > 1:
            raise self.fail(ins, f"{self.where(ins)}: {made}: operands of element types {', '.join(elements)}; "
                                 f"{ins.opcode} takes one")
        if ins.opcode in FLOAT_ONLY and elements and not elements[0].startswith(("f", "bf", "c")):
            raise self.fail(ins, f"{self.where(ins)}: {made}: {ins.opcode} takes a floating-point operand")
        want = "pred" if ins.opcode == "compare" else elements[0] if elements else ins.type.element
        if ins.type.element != want:
            raise self.fail(ins, f"{self.where(ins)}: declares {_type_text(ins.type)}, but {made} gives "
                                 f"{_Shape(want, ins.type.dims)}")

    def check(self, ins: _Instr, value: _Any, operands: list[_Type]) -> None:
        """The value an instruction made has the type it declares; an op of WHOLE its shape exactly."""
        def same(t: _Type, v: _Any) -> bool:
            if isinstance(t, tuple):
                return isinstance(v, tuple) and len(t) == len(v) and all(same(a, b) for a, b in zip(t, v))
            return (isinstance(v, _Value) and v.shape == t.dims and t.element in ELEMENT_TYPES
                    and v.dtype == ELEMENT_TYPES[t.element]
                    and _broadcastable(self.graph.tensors[v.tensor].shape, v.shape))
        if not same(ins.type, value):
            raise self.fail(ins, f"'{_clip(ins.name)}' declares {_type_text(ins.type)} but {ins.opcode} gives "
                                 f"{_clip(_value_text(value), 120)}")
        if ins.opcode in WHOLE and isinstance(value, _Value) and self.shape(value.tensor) != value.shape:
            raise self.fail(ins, f"{self.where(ins)}: declares {_type_text(ins.type)}, but {_made(ins, operands)} "
                                 f"gives {_Shape(ins.type.element, self.shape(value.tensor))}")

    def finish(self, root: _Instr, outputs: list[tuple[str, _Value]]) -> None:
        """Name the outputs, drop what they do not need, set the roles."""
        graph, made = self.graph, set()
        # where each tensor was made: a renamed one keeps its place (the order of the object's tensors)
        place = {name: i for i, name in enumerate(graph.tensors)}
        tensors = [self.full(root, value) for _, value in outputs]
        holding: dict[str, list[int]] = {}  # tensor -> the outputs whose entry of `tensors` it is
        for i, tensor in enumerate(tensors):
            holding.setdefault(tensor, []).append(i)
        for i, (name, value) in enumerate(outputs):
            tensor = tensors[i]
            computed = tensor in self.producer and graph.tensors[tensor].role == "intermediate" and tensor not in made
            if name in graph.tensors and name != tensor or name == tensor and not computed:
                # a folded constant, or the smaller tensor a broadcast output was made whole from,
                # holds the output's name: it moves aside
                movable = graph.tensors[name].role == "constant" or (name != tensor
                                                                     and graph.tensors[name].role == "intermediate")
                if not movable:
                    raise self.fail(root, f"output '{_clip(name)}' would take the name of another instruction")
                moved = self.fresh(f"{name}.value", own=False)
                self.rename(name, moved, tensors, holding, place)
                tensor = tensors[i]
            if computed:
                self.rename(tensor, name, tensors, holding, place)
            else:  # an input, a constant or another output: a copy under the output's name
                self.op(root, "RESHAPE", [tensor], {"new_shape": list(value.shape)}, value.dtype, name=name,
                        reuse=False)
            made.add(name)
        live = set(made)
        kept = []
        for op in reversed(graph.ops):
            if any(t in live for t in op.outputs):
                kept.append(op)
                live.update(op.inputs)
        graph.ops = kept[::-1]
        for name, t in list(graph.tensors.items()):
            if name not in live:
                if t.role == "input":
                    self.warnings.append(f"{self.file}:{self.input_lines[name]}: parameter '{name}' is not used; "
                                         "skipped")
                del graph.tensors[name]
                graph.constants.pop(name, None)
            elif name in made:
                t.role = "output"
        # inputs in parameter order, constants, the rest, outputs in the ROOT's order; else as made
        rank = {"input": 0, "constant": 1, "intermediate": 2, "output": 3}
        order = {name: i for i, (name, _) in enumerate(outputs)}
        graph.tensors = dict(sorted(graph.tensors.items(), key=lambda kv: (rank[kv[1].role], order.get(kv[0], 0),
                                                                           place.get(kv[0], len(place)))))

    def rename(self, old: str, new: str, tensors: list[str], holding: dict[str, list[int]],
               place: dict[str, int]) -> None:
        """Tensor `old` (and the op computing it) called `new` from here on, in `tensors` too
        (`holding` says where) and in `place`. Only its readers and its producer are touched, so
        naming many outputs costs no pass over the graph for each."""
        if old == new:
            return
        graph = self.graph
        t = graph.tensors.pop(old)
        t.name = new
        graph.tensors[new] = t
        if old in graph.constants:
            graph.constants[new] = graph.constants.pop(old)
        if old in place:
            place[new] = place.pop(old)
        readers = self.readers.pop(old, [])
        for op in readers:
            op.inputs = [new if n == old else n for n in op.inputs]
        self.readers.setdefault(new, []).extend(readers)
        op = self.producer.pop(old, None)
        if op is not None:
            op.outputs = [new if n == old else n for n in op.outputs]
            if op.name == old:
                op.name = new
                self.op_names.discard(old)
                self.op_names.add(new)
            self.producer[new] = op
        for i in holding.pop(old, []):
            tensors[i] = new
            holding.setdefault(new, []).append(i)

    # -- making ops and tensors

    def fresh(self, base: str, own: bool) -> str:
        """A tensor (and op) name not taken: `base` itself for an instruction's own result."""
        def taken(n: str) -> bool:
            return n in self.graph.tensors or n in self.op_names or (not own and n in self.reserved)
        name, k = base, 1
        while taken(name):
            name, k = f"{base}_{k}", k + 1
        return name

    def own_name(self, ins: _Instr) -> str:
        return self.prefix + ins.name

    def op(self, ins: _Instr, op_type: str, inputs: list[str], attrs: dict[str, Any], dtype: str,
           step: str | None = None, name: str | None = None, reuse: bool = True) -> str:
        """Add `op_type` on `inputs` for `ins`; its result tensor. `step` names a helper
        ("<name>.<step>"), else the result is the instruction's own. An op made before on the same
        inputs is reused, and one on constants folded, unless `reuse` is off."""
        opdef = lookup(op_type)
        operands = [self.graph.tensors[t] for t in inputs]
        try:
            norm = opdef.normalize_attrs(attrs)
            (shape,) = opdef.infer_shapes([t.shape for t in operands], [t.dtype for t in operands], norm)
        except ShapeError as exc:
            raise self.fail(ins, f"{self.where(ins)}: {exc}") from None
        shape = tuple(int(d) for d in shape)
        problem = shape_problem(shape)
        if problem:
            raise self.fail(ins, f"{self.where(ins)}: {problem}")
        key = (op_type, tuple(inputs), _freeze(norm), dtype)
        if reuse and key in self.cse:
            return self.cse[key]
        own = step is None
        base = name or (self.own_name(ins) if own else f"{self.own_name(ins)}.{step}")
        if reuse and all(t in self.graph.constants for t in inputs):
            folded = self.fold(opdef, operands, norm, shape, dtype)
            if folded is not None:
                result = self.constant(base, folded, dtype, own=own)
                self.cse[key] = result
                return result
        result = self.fresh(base, own=own or name is not None)
        self.graph.tensors[result] = Tensor(result, shape, dtype)
        op = Op(result, op_type, list(inputs), [result], attrs, f"{self.file}:{ins.line} '{ins.name}'")
        self.graph.ops.append(op)
        self.producer[result] = op
        for t in dict.fromkeys(inputs):
            self.readers.setdefault(t, []).append(op)
        self.op_names.add(result)
        if reuse:
            self.cse[key] = result
        return result

    def fold(self, opdef, operands: list[Tensor], attrs: dict, shape: tuple[int, ...], dtype: str) -> np.ndarray | None:
        """The op's result computed now by the registry's reference, or None (too large to fold)."""
        if opdef.name == "RESHAPE":
            return self.array(operands[0]).reshape(shape)
        if math.prod(shape) > FOLD_LIMIT or any(t.size > FOLD_LIMIT for t in operands):
            return None
        with np.errstate(all="ignore"):
            return opdef.reference([self.array(t) for t in operands], attrs, [dtype])[0]

    def array(self, tensor: Tensor) -> np.ndarray:
        return self.graph.constant_values(tensor.name)

    def constant(self, base: str, values: np.ndarray, dtype: str, own: bool = False) -> str:
        name = self.fresh(base, own=own)
        values = np.asarray(values)
        self.graph.tensors[name] = Tensor(name, tuple(values.shape), dtype, "constant")
        self.graph.set_constant(name, values)
        return name

    def scalar(self, ins: _Instr, value: float, dtype: str) -> str:
        key = ((), dtype, _freeze(float(value)))
        if key not in self.ones:
            self.ones[key] = self.constant(f"{self.own_name(ins)}.{_clip(str(value), 12)}", np.asarray(value), dtype)
        return self.ones[key]

    def value_of(self, tensor: str) -> np.ndarray | None:
        """A constant's values, or None for a tensor without known values."""
        if tensor not in self.graph.constants:
            return None
        return self.array(self.graph.tensors[tensor])

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.graph.tensors[tensor].shape

    # -- layout helpers

    def full(self, ins: _Instr, value: _Any) -> str:
        """The tensor of `value` at its HLO shape: a broadcast left to the readers is made here,
        as a MUL with ones over the broadcast dims (exact for every value, -0 and NaN included)."""
        if not isinstance(value, _Value):
            raise self.fail(ins, f"{self.where(ins)}: an operand is a tuple, an array is needed")
        have = self.shape(value.tensor)
        if have == value.shape:
            return value.tensor
        if math.prod(have) == math.prod(value.shape):
            return self.reshape(ins, value.tensor, value.shape, "full")
        padded = (1,) * (len(value.shape) - len(have)) + have
        ones_shape = tuple(d if p == 1 else 1 for p, d in zip(padded, value.shape))
        if math.prod(ones_shape) > MAX_MADE_CONSTANT:
            raise self.fail(ins, f"{self.where(ins)}: making the broadcast to {list(value.shape)} whole needs a "
                                 f"constant of {math.prod(ones_shape)} elements, more than {MAX_MADE_CONSTANT}")
        key = (ones_shape, value.dtype, "ones")
        if key not in self.ones:
            self.ones[key] = self.constant(f"{self.own_name(ins)}.ones", np.ones(ones_shape), value.dtype)
        return self.op(ins, "MUL", [value.tensor, self.ones[key]], {}, value.dtype, step="full")

    def reshape(self, ins: _Instr, tensor: str, shape: tuple[int, ...], step: str | None) -> str:
        if self.shape(tensor) == tuple(shape):
            return tensor
        producer = self.producer.get(tensor)
        if producer is not None and producer.op_type == "RESHAPE":  # a reshape of a reshape: of its operand
            tensor = producer.inputs[0]
            if self.shape(tensor) == tuple(shape):
                return tensor
        dtype = self.graph.tensors[tensor].dtype
        return self.op(ins, "RESHAPE", [tensor], {"new_shape": list(shape)}, dtype, step)

    def transpose(self, ins: _Instr, tensor: str, perm: list[int], step: str | None) -> str:
        if perm == sorted(perm):
            return tensor
        producer = self.producer.get(tensor)
        if producer is not None and producer.op_type == "TRANSPOSE":  # two permutations in one
            inner = lookup("TRANSPOSE").normalize_attrs(producer.attrs)["perms"]
            inner = list(reversed(range(len(perm)))) if inner is None else inner
            tensor, perm = producer.inputs[0], [inner[p] for p in perm]
            if perm == sorted(perm):
                return tensor
        dtype = self.graph.tensors[tensor].dtype
        return self.op(ins, "TRANSPOSE", [tensor], {"perms": list(perm)}, dtype, step)

    # -- reading an instruction

    def dtype(self, ins: _Instr, t: _Type) -> str:
        if not isinstance(t, _Shape):
            raise self.fail(ins, f"{self.where(ins)}: a tuple shape where an array is needed")
        if t.element not in ELEMENT_TYPES:
            raise self.fail(ins, f"{self.where(ins)}: element type '{t.element}' has no DFX dtype "
                                 f"(supported: {', '.join(ELEMENT_TYPES)})")
        return ELEMENT_TYPES[t.element]

    def result(self, ins: _Instr) -> tuple[tuple[int, ...], str]:
        """The instruction's declared array shape and DFX dtype."""
        dtype = self.dtype(ins, ins.type)
        return ins.type.dims, dtype

    def arity(self, ins: _Instr, args: list, *counts: int) -> None:
        if len(args) not in counts:
            wanted = " or ".join(map(str, counts))
            raise self.fail(ins, f"{self.where(ins)} takes {wanted} operand{'s' if counts != (1,) else ''}, "
                                 f"got {len(args)}")

    def attr(self, ins: _Instr, key: str, required: bool = True) -> str | None:
        if key not in ins.attrs:
            if required:
                raise self.fail(ins, f"{self.where(ins)}: attribute '{key}' is missing")
            return None
        return ins.attrs[key][0]

    def ints(self, ins: _Instr, key: str, default: list[int] | None = None) -> list[int]:
        text = self.attr(ins, key, required=default is None)
        if text is None:
            return list(default or [])
        values = _ints(text)
        if values is None:
            raise self.fail(ins, f"{self.where(ins)}: {key}={_clip(text)} is not a list of integers like {{1,0}}")
        return values

    def int_attr(self, ins: _Instr, key: str, default: int | None = None) -> int:
        text = self.attr(ins, key, required=default is None)
        if text is None:
            return default  # type: ignore[return-value]
        value = _int(text) if _INT.fullmatch(text) else None
        if value is None:
            raise self.fail(ins, f"{self.where(ins)}: {key}={_clip(text)} is not an integer")
        return value

    def axes(self, ins: _Instr, key: str, dims: list[int], rank: int, what: str) -> None:
        """Each of `dims` a different dimension of a rank-`rank` operand."""
        if len(set(dims)) != len(dims) or any(not 0 <= d < rank for d in dims):
            raise self.fail(ins, f"{self.where(ins)}: {key}={{{','.join(map(str, dims))}}} is not a set of "
                                 f"dimensions of the rank-{rank} {what}")

    def called(self, ins: _Instr, key: str) -> _Computation:
        text = self.attr(ins, key)
        name = text[1:] if text.startswith("%") else text
        comp = self.module.computations.get(name)
        if comp is None:
            raise self.fail(ins, f"{self.where(ins)}: {key}={_clip(text)}: no computation of that name")
        return comp

    def inline(self, ins: _Instr, comp: _Computation, args: list[_Any]) -> _Any:
        if comp.name in self.calls or len(self.calls) >= MAX_CALL_DEPTH:
            raise self.fail(ins, f"{self.where(ins)}: computation '{_clip(comp.name)}' calls itself")
        params = [i for i in comp.instrs.values() if i.opcode == "parameter"]
        if len(params) != len(args):
            raise self.fail(ins, f"{self.where(ins)}: computation '{_clip(comp.name)}' has {len(params)} "
                                 f"parameters, {len(args)} operands are given")
        if not self.calls:  # an outermost call: its size counts the calls inside it
            size = self.inlined_size(comp)
            self.inlined += size
            if self.inlined > MAX_INLINED:
                before = "" if size == self.inlined else f", {self.inlined} with the calls inlined before it"
                raise self.fail(ins, f"{self.where(ins)}: inlining computation '{_clip(comp.name)}' makes {size} "
                                     f"instructions{before}, more than the {MAX_INLINED} a module may inline")
        saved = self.prefix
        self.calls.append(comp.name)
        self.prefix = f"{self.prefix}{ins.name}."
        try:
            return self.computation(comp, dict(enumerate(args)))
        finally:
            self.prefix = saved
            self.calls.pop()

    def callee(self, ins: _Instr) -> _Computation | None:
        """The computation a fusion or call inlines (None: another opcode, or a name `called` refuses)."""
        key = CALLS.get(ins.opcode)
        if key not in ins.attrs:
            return None
        text = ins.attrs[key][0]
        return self.module.computations.get(text[1:] if text.startswith("%") else text)

    def inlined_size(self, comp: _Computation) -> int:
        """The instructions inlining `comp` makes: its own, each call among them counted as the
        computation it calls. Each computation is counted once and remembered, the calls walked
        depth first on a stack of their own (a chain of calls may be longer than Python recurses);
        a call back into a computation on the path counts nothing, as inlining refuses it."""
        stack: list[tuple[_Computation, list | None]] = [(comp, None)]
        path: set[str] = set()
        while stack:
            c, callees = stack.pop()
            if c.name in self.sizes or (callees is None and c.name in path):
                continue
            if callees is None:  # first met: count its callees first, then come back to it
                callees = [self.callee(i) for i in c.instrs.values()]
                path.add(c.name)
                stack.append((c, callees))
                stack.extend((d, None) for d in callees if d is not None and d.name not in self.sizes)
                continue
            self.sizes[c.name] = sum(1 if d is None else self.sizes.get(d.name, 0) for d in callees)
            path.discard(c.name)
        return self.sizes.get(comp.name, 0)


def _made(ins: _Instr, operands: list[_Type]) -> str:
    """What an instruction computes from, for messages: `add of f32[4], f32[4]`."""
    return f"{ins.opcode} of {', '.join(map(_type_text, operands))}"


def _flatten(name: str, value: _Any):
    if isinstance(value, tuple):
        for i, element in enumerate(value):
            yield from _flatten(f"{name}.{i}", element)
    else:
        yield name, value


def _value_text(value: _Any) -> str:
    if isinstance(value, tuple):
        return f"({', '.join(_value_text(v) for v in value)})"
    return f"{value.dtype}{list(value.shape)}"


# ---- handlers: one per opcode ----------------------------------------------------------------

Handler = Callable[[_Builder, _Instr, list], _Any]


def _constant(b: _Builder, ins: _Instr, args: list) -> _Value:
    dims, dtype = b.result(ins)
    values = _literal_array(b, ins, dims, dtype)
    return _Value(b.constant(b.own_name(ins), values, dtype, own=True), dims, dtype)


def _literal_array(b: _Builder, ins: _Instr, dims: tuple[int, ...], dtype: str) -> np.ndarray:
    flat: list[str] = []

    def walk(node: Any, depth: int) -> None:
        if depth == len(dims):
            if isinstance(node, list):
                raise b.fail(ins, f"{b.where(ins)}: the value has more levels of '{{}}' than the shape "
                                  f"{list(dims)} has dimensions")
            flat.append(node)
            return
        if not isinstance(node, list) or len(node) != dims[depth]:
            got = f"{len(node)} values" if isinstance(node, list) else f"'{_clip(node)}'"
            raise b.fail(ins, f"{b.where(ins)}: dimension {depth} of the shape {list(dims)} needs "
                              f"{dims[depth]} values, the constant gives {got}")
        for item in node:
            walk(item, depth + 1)

    walk(ins.literal, 0)
    element = ins.type.element
    if element == "pred":
        bits = {"true": 1, "false": 0, "1": 1, "0": 0}
        bad = next((v for v in flat if v not in bits), None)
        if bad is not None:
            raise b.fail(ins, f"{b.where(ins)}: '{_clip(bad)}' is not a pred value (true, false, 1, 0)")
        return np.asarray([bits[v] for v in flat], np.uint8).reshape(dims)
    if dtypes.is_integer(dtype):
        info = np.iinfo(dtypes.numpy_dtype(dtype))
        ints = []
        for v in flat:
            n = _int(v) if _INT.fullmatch(v) else None
            if n is None or not info.min <= n <= info.max:
                raise b.fail(ins, f"{b.where(ins)}: '{_clip(v)}' is not a {element} value")
            ints.append(n)
        return np.asarray(ints, np.int64).astype(dtypes.numpy_dtype(dtype)).reshape(dims)
    numbers = []
    for v in flat:
        if v in ("true", "false"):
            raise b.fail(ins, f"{b.where(ins)}: '{v}' is not a {element} value")
        numbers.append(float(v))
    with np.errstate(all="ignore"):  # beyond the dtype's range: inf, as XLA rounds
        return np.asarray(numbers, np.float64).astype(dtypes.numpy_dtype(dtype)).reshape(dims)


def _iota(b: _Builder, ins: _Instr, args: list) -> _Value:
    b.arity(ins, args, 0)
    dims, dtype = b.result(ins)
    axis = b.int_attr(ins, "iota_dimension")
    b.axes(ins, "iota_dimension", [axis], len(dims), "result")
    if dims[axis] > MAX_MADE_CONSTANT:
        raise b.fail(ins, f"{b.where(ins)}: {dims[axis]} values are more than the {MAX_MADE_CONSTANT} a "
                          "constant made by the compiler may have")
    # the values along `axis` only, broadcast to the rest by whoever reads them
    shape = tuple(d if k == axis else 1 for k, d in enumerate(dims))[axis:]
    values = np.arange(dims[axis]).reshape(shape)
    with np.errstate(all="ignore"):
        values = values.astype(dtypes.numpy_dtype(dtype))
    return _Value(b.constant(b.own_name(ins), values, dtype, own=True), dims, dtype)


def _map(op_type: str, arity: int) -> Handler:
    def handler(b: _Builder, ins: _Instr, args: list) -> _Value:
        b.arity(ins, args, arity)
        if isinstance(ins.type, _Shape) and ins.type.element == "pred" and op_type not in PRED_CLOSED:
            # a pred holds 0 or 1 in a byte: arithmetic on it would leave other values there
            raise b.fail(ins, f"{b.where(ins)}: '{ins.opcode}' on pred is not supported (and, or, not are)")
        dims, dtype = b.result(ins)
        return _Value(b.op(ins, op_type, _elementwise_args(b, ins, args, dims), {}, dtype), dims, dtype)
    return handler


def _pred_map(op_type: str, arity: int) -> Handler:
    def handler(b: _Builder, ins: _Instr, args: list) -> _Value:
        if not isinstance(ins.type, _Shape) or ins.type.element != "pred":
            raise b.fail(ins, f"{b.where(ins)}: '{ins.opcode}' is supported on pred only (bitwise "
                              f"{ins.opcode} on integers is not in the registry)")
        return _map(op_type, arity)(b, ins, args)
    return handler


def _not(b: _Builder, ins: _Instr, args: list) -> _Value:
    b.arity(ins, args, 1)
    if not isinstance(ins.type, _Shape) or ins.type.element != "pred":
        raise b.fail(ins, f"{b.where(ins)}: 'not' is supported on pred only")
    dims, dtype = b.result(ins)
    [x] = _elementwise_args(b, ins, args, dims)
    return _Value(b.op(ins, "SUB", [b.scalar(ins, 1, "u8"), x], {}, dtype), dims, dtype)


def _array_arg(b: _Builder, ins: _Instr, arg: _Any) -> _Value:
    if not isinstance(arg, _Value):
        raise b.fail(ins, f"{b.where(ins)}: an operand is a tuple, an array is needed")
    return arg


def _elementwise_args(b: _Builder, ins: _Instr, args: list, dims: tuple[int, ...]) -> list[str]:
    """The tensors of an elementwise op's operands, each of the result's shape (or a scalar)."""
    tensors = []
    for i, arg in enumerate(args):
        value = _array_arg(b, ins, arg)
        if value.shape not in (dims, ()):
            raise b.fail(ins, f"{b.where(ins)}: operand {i} is {value.dtype}{list(value.shape)}, the result "
                              f"{list(dims)}")
        tensors.append(value.tensor)
    return tensors


def _compare(b: _Builder, ins: _Instr, args: list) -> _Value:
    b.arity(ins, args, 2)
    dims, dtype = b.result(ins)
    direction = b.attr(ins, "direction")
    if direction not in COMPARISONS:
        raise b.fail(ins, f"{b.where(ins)}: direction={_clip(direction)} is not one of {', '.join(COMPARISONS)}")
    x, y = _elementwise_args(b, ins, args, dims)
    if direction != "NE":
        return _Value(b.op(ins, COMPARISONS[direction], [x, y], {}, dtype), dims, dtype)
    equal = b.op(ins, "EQUAL", [x, y], {}, dtype, step="eq")
    return _Value(b.op(ins, "SUB", [b.scalar(ins, 1, dtype), equal], {}, dtype), dims, dtype)


def _clamp(b: _Builder, ins: _Instr, args: list) -> _Value:
    b.arity(ins, args, 3)
    dims, dtype = b.result(ins)
    low, x, high = _elementwise_args(b, ins, args, dims)
    at_least = b.op(ins, "MAXIMUM", [x, low], {}, dtype, step="max")
    return _Value(b.op(ins, "MINIMUM", [at_least, high], {}, dtype), dims, dtype)


def _convert(b: _Builder, ins: _Instr, args: list) -> _Value:
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    _elementwise_args(b, ins, args, dims)
    x = args[0]
    if ins.type.element == "pred":  # x != 0, whatever x is
        zero = b.scalar(ins, 0, x.dtype)
        equal = b.op(ins, "EQUAL", [x.tensor, zero], {}, dtype, step="eq")
        return _Value(b.op(ins, "SUB", [b.scalar(ins, 1, dtype), equal], {}, dtype), dims, dtype)
    if x.dtype == dtype:
        return _Value(x.tensor, dims, dtype)
    return _Value(b.op(ins, "CAST", [x.tensor], {"dtype": dtype}, dtype), dims, dtype)


def _copy(b: _Builder, ins: _Instr, args: list) -> _Any:
    b.arity(ins, args, 1)
    return args[0]


def _broadcast(b: _Builder, ins: _Instr, args: list) -> _Value:
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    x = _array_arg(b, ins, args[0])
    where = b.ints(ins, "dimensions", default=[])
    if len(where) != len(x.shape):
        raise b.fail(ins, f"{b.where(ins)}: dimensions={{{','.join(map(str, where))}}} has {len(where)} entries "
                          f"for the rank-{len(x.shape)} operand")
    b.axes(ins, "dimensions", where, len(dims), "result")
    for k, d in enumerate(where):
        if x.shape[k] not in (1, dims[d]):
            raise b.fail(ins, f"{b.where(ins)}: operand dimension {k} ({x.shape[k]}) does not broadcast to result "
                              f"dimension {d} ({dims[d]})")
    # the operand's tensor, padded to its HLO rank, its dims put in the order they take in the result
    have = b.shape(x.tensor)
    padded = (1,) * (len(x.shape) - len(have)) + have
    order = sorted(range(len(where)), key=lambda k: where[k])
    tensor = x.tensor
    if order != list(range(len(order))):
        tensor = b.transpose(ins, b.reshape(ins, tensor, padded, "rank"), order, "order")
        padded = tuple(padded[k] for k in order)
    placed = [1] * len(dims)
    for position, size in zip(sorted(where), padded):
        placed[position] = size
    # right-aligned, leading 1s say nothing to numpy's broadcasting: a tensor that places its dims
    # so already stays as it is; else it is reshaped to the result's rank
    if _strip(b.shape(tensor)) != _strip(tuple(placed)):
        tensor = b.reshape(ins, tensor, tuple(placed), None)
    return _Value(tensor, dims, dtype)


def _strip(shape: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` without its leading 1s."""
    k = 0
    while k < len(shape) and shape[k] == 1:
        k += 1
    return shape[k:]


def _reshape(b: _Builder, ins: _Instr, args: list) -> _Value:
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    x = _array_arg(b, ins, args[0])
    if math.prod(x.shape) != math.prod(dims):
        raise b.fail(ins, f"{b.where(ins)}: cannot reshape {list(x.shape)} ({math.prod(x.shape)} elements) to "
                          f"{list(dims)} ({math.prod(dims)} elements)")
    if ins.opcode == "bitcast" and x.dtype != dtype:
        raise b.fail(ins, f"{b.where(ins)}: a bitcast from {x.dtype} to {dtype} reinterprets bits, which is not "
                          "supported (only a bitcast that reshapes)")
    return _Value(b.reshape(ins, b.full(ins, x), dims, None), dims, dtype)


def _transpose(b: _Builder, ins: _Instr, args: list) -> _Value:
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    x = _array_arg(b, ins, args[0])
    perm = b.ints(ins, "dimensions")
    if sorted(perm) != list(range(len(x.shape))):
        raise b.fail(ins, f"{b.where(ins)}: dimensions={{{','.join(map(str, perm))}}} is not a permutation of the "
                          f"rank-{len(x.shape)} operand's dimensions")
    return _Value(b.transpose(ins, b.full(ins, x), perm, None), dims, dtype)


def _dot(b: _Builder, ins: _Instr, args: list) -> _Value:
    """lhs [batch, free, contracted] and rhs [batch, contracted, free] (each transposed where
    they are not in that order), reshaped to [batch..., M, K] and [batch..., K, N]; the MATMUL's
    [batch..., M, N] reshaped to HLO's result [batch..., lhs free..., rhs free...]."""
    b.arity(ins, args, 2)
    dims, dtype = b.result(ins)
    lhs, rhs = (_array_arg(b, ins, a) for a in args)
    batch = b.ints(ins, "lhs_batch_dims", []), b.ints(ins, "rhs_batch_dims", [])
    contracted = b.ints(ins, "lhs_contracting_dims", []), b.ints(ins, "rhs_contracting_dims", [])
    for side, x in enumerate((lhs, rhs)):
        which = ("lhs", "rhs")[side]
        b.axes(ins, f"{which}_batch_dims and {which}_contracting_dims", batch[side] + contracted[side],
               len(x.shape), f"{which} {list(x.shape)}")
    for kind, (l_dims, r_dims) in (("batch", batch), ("contracting", contracted)):
        sizes = [lhs.shape[d] for d in l_dims], [rhs.shape[d] for d in r_dims]
        if sizes[0] != sizes[1]:
            raise b.fail(ins, f"{b.where(ins)}: {kind} dimensions differ: lhs {sizes[0]}, rhs {sizes[1]}")
    free = [[d for d in range(len(x.shape)) if d not in batch[s] + contracted[s]] for s, x in enumerate((lhs, rhs))]
    batch_sizes = [lhs.shape[d] for d in batch[0]]
    m = math.prod(lhs.shape[d] for d in free[0])
    n = math.prod(rhs.shape[d] for d in free[1])
    k = math.prod(lhs.shape[d] for d in contracted[0])
    a = b.transpose(ins, b.full(ins, lhs), batch[0] + free[0] + contracted[0], "lhs")
    a = b.reshape(ins, a, (*batch_sizes, m, k), "lhs")
    w = b.transpose(ins, b.full(ins, rhs), batch[1] + contracted[1] + free[1], "rhs")
    w = b.reshape(ins, w, (*batch_sizes, k, n), "rhs")
    want = (*batch_sizes, *(lhs.shape[d] for d in free[0]), *(rhs.shape[d] for d in free[1]))
    if want != dims:
        raise b.fail(ins, f"{b.where(ins)}: declares {list(dims)}, the dot of {list(lhs.shape)} and "
                          f"{list(rhs.shape)} gives {list(want)}")
    product = (*batch_sizes, m, n)
    c = b.op(ins, "MATMUL", [a, w], {}, dtype, step=None if product == dims else "matmul")
    return _Value(b.reshape(ins, c, dims, None), dims, dtype)


def _window(b: _Builder, ins: _Instr, kernel: tuple[int, int]) -> dict[str, Any]:
    """CONV2D's stride, dilation and padding from `window={size=.. stride=.. pad=.. rhs_dilate=..}`."""
    text = b.attr(ins, "window", required=False)
    fields: dict[str, str] = {}
    if text is not None:
        if not (text.startswith("{") and text.endswith("}")):
            raise b.fail(ins, f"{b.where(ins)}: window={_clip(text)} is not {{size=.. stride=.. pad=..}}")
        for item in text[1:-1].split():
            key, sep, value = item.partition("=")
            if not sep:
                raise b.fail(ins, f"{b.where(ins)}: window: '{_clip(item)}' is not key=value")
            fields[key] = value

    def dxd(key: str, default: int) -> list[int]:
        if key not in fields:
            return [default, default]
        if not _DXD.fullmatch(fields[key]) or any(len(v) > MAX_INT_DIGITS for v in fields[key].split("x")):
            raise b.fail(ins, f"{b.where(ins)}: window {key}={_clip(fields[key])} is not like 3x3")
        values = [int(v) for v in fields[key].split("x")]
        if len(values) != 2:
            raise b.fail(ins, f"{b.where(ins)}: window {key}={fields[key]} has {len(values)} entries for 2 "
                              "spatial dimensions")
        return values

    size = dxd("size", 0)
    if "size" in fields and tuple(size) != kernel:
        raise b.fail(ins, f"{b.where(ins)}: window size={fields['size']} differs from the kernel's {kernel[0]}x{kernel[1]}")
    if dxd("lhs_dilate", 1) != [1, 1]:
        raise b.fail(ins, f"{b.where(ins)}: lhs_dilate={fields['lhs_dilate']} (a transposed convolution) is not "
                          "supported")
    if "rhs_reversal" in fields and set(fields["rhs_reversal"].split("x")) != {"0"}:
        raise b.fail(ins, f"{b.where(ins)}: rhs_reversal is not supported")
    padding = [[0, 0], [0, 0]]
    if "pad" in fields:
        pads = _pads(fields["pad"])
        if pads is None or len(pads) != 2 or any(p[2] for p in pads):
            raise b.fail(ins, f"{b.where(ins)}: window pad={_clip(fields['pad'])} is not like 1_1x1_1")
        if any(v < 0 for p in pads for v in p[:2]):
            raise b.fail(ins, f"{b.where(ins)}: negative window padding {fields['pad']} is not supported")
        padding = [list(p[:2]) for p in pads]
    stride, dilation = dxd("stride", 1), dxd("rhs_dilate", 1)
    if 0 in stride or 0 in dilation:
        raise b.fail(ins, f"{b.where(ins)}: window strides and dilations must be at least 1")
    return {"stride": stride, "dilation": dilation, "padding": padding}


def _pads(text: str) -> list[tuple[int, int, int]] | None:
    """`lo_hi[_interior]` per dim, joined by `x`; None when the text is not that."""
    pads = []
    for item in text.split("x"):
        m = _PAD_DIM.fullmatch(item)
        if not m or any(g and len(g.lstrip("-")) > MAX_INT_DIGITS for g in m.groups()):
            return None
        pads.append((int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)))
    return pads


def _convolution(b: _Builder, ins: _Instr, args: list) -> _Value:
    """CONV2D NHWC with OHWI weights: each operand transposed there from its dim labels, and
    the result from NHWC to the output's labels."""
    b.arity(ins, args, 2)
    dims, dtype = b.result(ins)
    x, w = (_array_arg(b, ins, a) for a in args)
    text = b.attr(ins, "dim_labels")
    labels = _DIM_LABELS.fullmatch(text)
    spatial = ("0", "1")
    if not labels or any(sorted(l) != sorted(want) for l, want in zip(labels.groups(), ("b01f", "01io", "b01f"))):
        raise b.fail(ins, f"{b.where(ins)}: dim_labels={_clip(text)}: only convolutions with two spatial "
                          "dimensions (labels b, 0, 1, f / 0, 1, i, o) map onto CONV2D")
    lhs, rhs, out = labels.groups()
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise b.fail(ins, f"{b.where(ins)}: operands {list(x.shape)} and {list(w.shape)} are not rank 4")
    if b.int_attr(ins, "batch_group_count", 1) != 1:
        raise b.fail(ins, f"{b.where(ins)}: batch_group_count other than 1 is not supported")
    groups = b.int_attr(ins, "feature_group_count", 1)
    if groups < 1:
        raise b.fail(ins, f"{b.where(ins)}: feature_group_count={groups} is not positive")
    kernel = (w.shape[rhs.index(spatial[0])], w.shape[rhs.index(spatial[1])])
    attrs = {**_window(b, ins, kernel), "groups": groups}
    nhwc = b.transpose(ins, b.full(ins, x), [lhs.index(c) for c in "b01f"], "input")
    ohwi = b.transpose(ins, b.full(ins, w), [rhs.index(c) for c in "o01i"], "weights")
    perm = ["b01f".index(c) for c in out]
    step = None if perm == sorted(perm) else "conv"
    y = b.op(ins, "CONV2D", [nhwc, ohwi], attrs, dtype, step=step)
    return _Value(b.transpose(ins, y, perm, None), dims, dtype)


def _reduce(b: _Builder, ins: _Instr, args: list) -> _Value:
    if len(args) != 2:
        raise b.fail(ins, f"{b.where(ins)}: a reduce of {len(args) // 2 or len(args)} operands at once is not "
                          "supported (one operand and its init value)")
    dims, dtype = b.result(ins)
    x, init = (_array_arg(b, ins, a) for a in args)
    comp = b.called(ins, "to_apply")
    kind = _reducer(b, ins, comp)
    if kind in ("or", "and") and ins.type.element != "pred":
        raise b.fail(ins, f"{b.where(ins)}: a reduction by '{kind}' is supported on pred only")
    axes = b.ints(ins, "dimensions")
    b.axes(ins, "dimensions", axes, len(x.shape), f"operand {list(x.shape)}")
    reduce_op, combine = REDUCERS[kind]
    if init.shape != ():
        raise b.fail(ins, f"{b.where(ins)}: the init value is {list(init.shape)}, a scalar is needed")
    start = b.value_of(init.tensor)
    # an init value equal to the reduction's identity needs no op after the REDUCE; of pred, `and`
    # (a MIN over 0 and 1) starts from true, 1, not the u8 highest
    neutral = 1 if kind == "and" else reduction.identity(reduce_op, dtypes.numpy_dtype(dtype))
    identity_init = start is not None and bool(np.all(start.astype(np.float64) == neutral))
    step = None if identity_init else "reduce"
    reduced = b.op(ins, reduce_op, [b.full(ins, x)], {"axes": axes, "keepdims": False}, dtype, step=step)
    if not identity_init:  # an init value that is not the identity takes part once
        reduced = b.op(ins, combine, [reduced, init.tensor], {}, dtype)
    return _Value(reduced, dims, dtype)


def _reducer(b: _Builder, ins: _Instr, comp: _Computation) -> str:
    params = sorted((i for i in comp.instrs.values() if i.opcode == "parameter"), key=lambda i: i.index)
    root = comp.root
    if (root.opcode in REDUCERS and len(params) == 2 and len(root.operands) == 2
            and sorted(root.operands) == sorted(p.name for p in params)):
        return root.opcode
    raise b.fail(ins, f"{b.where(ins)}: to_apply computation '{_clip(comp.name)}' is not one add, multiply, "
                      "maximum or minimum of its two parameters")


def _slice(b: _Builder, ins: _Instr, args: list) -> _Value:
    """SLICE of the box, then a GATHER along each dim with a stride (the registry has no strided
    slice; GATHER takes the indices as an attribute)."""
    b.arity(ins, args, 1)
    dims, dtype = b.result(ins)
    x = _array_arg(b, ins, args[0])
    text = b.attr(ins, "slice")
    inner = text[1:-1] if text.startswith("{") and text.endswith("}") else None
    found = list(_SLICE_DIM.finditer(inner)) if inner is not None else []
    if inner is None or re.sub(r"[\s,]", "", _SLICE_DIM.sub("", inner)) or len(found) != len(x.shape):
        raise b.fail(ins, f"{b.where(ins)}: slice={_clip(text)} is not one [start:limit] or [start:limit:stride] "
                          f"per dimension of the rank-{len(x.shape)} operand")
    bounds = []
    for axis, m in enumerate(found):
        values = [_int(g) if g is not None else 1 for g in m.groups()]
        if None in values:
            raise b.fail(ins, f"{b.where(ins)}: slice={_clip(text)}: a number is too long")
        start, limit, stride = values
        if not 0 <= start <= limit <= x.shape[axis] or stride < 1:
            raise b.fail(ins, f"{b.where(ins)}: slice [{start}:{limit}:{stride}] does not fit dimension {axis} of "
                              f"{list(x.shape)}")
        bounds.append((start, limit, stride))
    strided = [axis for axis, (_, _, stride) in enumerate(bounds) if stride > 1]
    tensor = b.full(ins, x)
    if any(start > 0 or limit < x.shape[axis] for axis, (start, limit, _) in enumerate(bounds)):
        attrs = {"start": [s for s, _, _ in bounds], "size": [l - s for s, l, _ in bounds]}
        tensor = b.op(ins, "SLICE", [tensor], attrs, dtype, step="box" if strided else None)
    for i, axis in enumerate(strided):
        start, limit, stride = bounds[axis]
        if limit - start > MAX_MADE_CONSTANT:
            raise b.fail(ins, f"{b.where(ins)}: a strided slice of {limit - start} elements is too long")
        indices = list(range(0, limit - start, stride))
        tensor = b.op(ins, "GATHER", [tensor], {"indices": indices, "axis": axis}, dtype,
                      step=None if i == len(strided) - 1 else f"stride{axis}")
    return _Value(tensor, dims, dtype)


def _concatenate(b: _Builder, ins: _Instr, args: list) -> _Value:
    if not args:
        raise b.fail(ins, f"{b.where(ins)} takes at least one operand")
    dims, dtype = b.result(ins)
    axes = b.ints(ins, "dimensions")
    if len(axes) != 1:
        raise b.fail(ins, f"{b.where(ins)}: dimensions= must name one dimension")
    tensors = [b.full(ins, _array_arg(b, ins, a)) for a in args]
    b.axes(ins, "dimensions", axes, len(dims), "result")
    if len(tensors) == 1:
        return _Value(tensors[0], dims, dtype)
    return _Value(b.op(ins, "CONCAT", tensors, {"axis": axes[0]}, dtype), dims, dtype)


def _pad(b: _Builder, ins: _Instr, args: list) -> _Value:
    b.arity(ins, args, 2)
    dims, dtype = b.result(ins)
    x, fill = (_array_arg(b, ins, a) for a in args)
    text = b.attr(ins, "padding")
    pads = _pads(text)
    if pads is None or len(pads) != len(x.shape):
        raise b.fail(ins, f"{b.where(ins)}: padding={_clip(text)} is not one lo_hi[_interior] per dimension "
                          f"of the rank-{len(x.shape)} operand")
    if any(interior for _, _, interior in pads):
        raise b.fail(ins, f"{b.where(ins)}: interior padding ({text}) is not supported: the registry's PAD "
                          "pads around each dimension only")
    values = b.value_of(fill.tensor)
    if values is None or fill.shape != ():
        raise b.fail(ins, f"{b.where(ins)}: the padding value must be a scalar constant")
    value = int(values) if dtypes.is_integer(fill.dtype) else float(values)
    if isinstance(value, float) and math.isnan(value):
        raise b.fail(ins, f"{b.where(ins)}: padding with nan is not supported (the object file has no NaN)")
    tensor = b.full(ins, x)
    if any(lo < 0 or hi < 0 for lo, hi, _ in pads):  # negative padding crops
        start = [max(-lo, 0) for lo, _, _ in pads]
        size = [d - s - max(-hi, 0) for d, s, (_, hi, _) in zip(x.shape, start, pads)]
        if any(s < 0 for s in size):
            raise b.fail(ins, f"{b.where(ins)}: padding={text} crops more than the operand holds")
        tensor = b.op(ins, "SLICE", [tensor], {"start": start, "size": size}, dtype, step="crop")
    padding = [[max(lo, 0), max(hi, 0)] for lo, hi, _ in pads]
    if any(lo or hi for lo, hi in padding):
        tensor = b.op(ins, "PAD", [tensor], {"padding": padding, "pad_value": value}, dtype)
    return _Value(tensor, dims, dtype)


def _select(b: _Builder, ins: _Instr, args: list) -> _Value:
    return _map("SELECT", 3)(b, ins, args)


def _tuple(b: _Builder, ins: _Instr, args: list) -> tuple:
    return tuple(args)


def _get_tuple_element(b: _Builder, ins: _Instr, args: list) -> _Any:
    b.arity(ins, args, 1)
    index = b.int_attr(ins, "index")
    if not isinstance(args[0], tuple) or not 0 <= index < len(args[0]):
        size = len(args[0]) if isinstance(args[0], tuple) else "no"
        raise b.fail(ins, f"{b.where(ins)}: index={index} of an operand with {size} tuple elements")
    return args[0][index]


def _call(key: str) -> Handler:
    def handler(b: _Builder, ins: _Instr, args: list) -> _Any:
        return b.inline(ins, b.called(ins, key), args)
    return handler


HANDLERS: dict[str, Handler] = {
    "constant": _constant,
    "iota": _iota,
    **{opcode: _map(op, 1) for opcode, op in UNARY.items()},
    **{opcode: _map(op, 2) for opcode, op in BINARY.items()},
    **{opcode: _pred_map(op, 2) for opcode, op in PRED_BINARY.items()},
    "not": _not,
    "compare": _compare,
    "select": _select,
    "clamp": _clamp,
    "convert": _convert,
    "copy": _copy,
    "broadcast": _broadcast,
    "reshape": _reshape,
    "bitcast": _reshape,
    "transpose": _transpose,
    "dot": _dot,
    "convolution": _convolution,
    "reduce": _reduce,
    "slice": _slice,
    "concatenate": _concatenate,
    "pad": _pad,
    "tuple": _tuple,
    "get-tuple-element": _get_tuple_element,
    **{opcode: _call(key) for opcode, key in CALLS.items()},
}


def parse_hlo(path: str, text: str) -> tuple[Graph, list[str]]:
    """Parse an HLO text module (the file `path`, which names it in messages) into a graph and warning lines."""
    warnings: list[str] = []
    module = _Parser(path, text).module()
    graph = _Builder(path, module, warnings).build()
    return graph, warnings
