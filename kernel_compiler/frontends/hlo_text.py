"""The HLO text reader: an HloModule as XLA and JAX print it, read by a small lexer and a
recursive-descent parser into computations of instructions. It knows the syntax, no opcode's
meaning: the builder (`hlo_build`) and the op table (`hlo_ops`) make the graph from what it reads.

Text. `HloModule name[, attribute=value]*`, then the debug tables recent XLA prints
(`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`, each a name and rows `<id> "text"`
or `<id> {...}`, possibly none), read and skipped, then computations `[ENTRY] name [(p: shape,
...) -> shape] { instruction* }[, attribute=value]*` (`execution_thread=...`), an instruction
being `[ROOT] name = shape opcode(operands)[, attribute=value]*`. Names are written with or
without `%`. A shape is `f32[2,3]` and its layout `{1,0}`, the dims minor to major, with any
tiling or memory-space suffix (`{1,0:T(8,128)S(1)}`); the graph holds every tensor row-major, so
a layout matters only to a bitcast, which the op table reads it for. A tuple shape is `(f32[],
s32[2])`. Operands may carry their shape (`f32[2] %x`, older printers). An attribute value
(`metadata`, `backend_config`, `sharding`, `frontend_attributes`, ...) is read as raw text, a
balanced `{...}`, a string or a bare word; what it means is the op table's. `//` and `/* */`
comments (`/*index=5*/`) are skipped. The ENTRY computation is the one marked so, else the last;
its ROOT the instruction marked so, else the last. Errors are one line, "<file>:<line>:
<reason>", the line the instruction (or the token) is on.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Any

from dfx.graph import MAX_RANK, shape_problem

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


# the tables of source locations XLA prints between the module's header and its computations
# (instructions refer to them by `metadata={... stack_frame_id=N}`); read and skipped
DEBUG_TABLES = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})

MAX_TUPLE_DEPTH = 32  # tuple shapes inside each other
MAX_INT_DIGITS = 18

# ---- lexer -----------------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_](?:[A-Za-z0-9_.]|-(?!>))*")
_NUMBER = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_SPACE = re.compile(r"(?:[ \t\r\n]+|//[^\n]*|/\*.*?\*/)*", re.S)
INT_TEXT = re.compile(r"-?[0-9]+")
_LAYOUT_START = re.compile(r"\{[ \t]*[0-9:}]")
_MEMORY_SPACE = re.compile(r"S\([0-9]+\)")


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
        return CompileError(one_line(f"{self.file}:{self.line(pos)}: {reason}"))

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

    def layout(self, rank: int) -> tuple[tuple[int, ...] | None, bool]:
        """A shape's layout, `{1,0}` or `{1,0:T(8,128)S(1)}`, if one follows: braces opening on a
        digit, ':' or '}' (a computation's body opens on a name). Its dims minor to major (None:
        no layout, or one without dims), and whether it says more than where each dim goes
        (tiles, element sizes: what a memory space `S(n)` alone does not)."""
        self._unpeek()
        self._skip()
        if not _LAYOUT_START.match(self.text, self.pos):
            return None, False
        start = self.pos
        self.pos = self._balanced(start, "a layout")
        order, _, rest = self.text[start + 1:self.pos - 1].partition(":")
        dims = int_list("{" + order + "}")
        if dims is None or (dims and sorted(dims) != list(range(rank))):
            raise self.fail(start, f"layout {clip(self.text[start:self.pos])} is not an order of the "
                                   f"shape's {rank} dimensions")
        return tuple(dims) or None, bool(_MEMORY_SPACE.sub("", rest).strip())

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
    return f"'{clip(token.text)}'"


def clip(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(message: str) -> str:
    return " ".join(message.splitlines())


# ---- parser ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    element: str  # the HLO element type: f32, pred, ...
    dims: tuple[int, ...]
    # its layout: the dims minor to major (None: none written, row-major), and whether tiles or
    # packing place the elements otherwise. The graph holds every tensor row-major, so a layout
    # only places bytes, except to a bitcast, XLA's view of the same bytes as another shape
    layout: tuple[int, ...] | None = field(default=None, compare=False)
    tiled: bool = field(default=False, compare=False)

    @property
    def major_to_minor(self) -> list[int]:
        """The dims in the order their elements lie in memory, outermost first."""
        return list(range(len(self.dims))) if self.layout is None else list(reversed(self.layout))

    def __str__(self) -> str:
        return f"{self.element}[{','.join(map(str, self.dims))}]"


HloType = Any  # a Shape, or a tuple of HloType


def type_text(t: HloType) -> str:
    return str(t) if isinstance(t, Shape) else f"({', '.join(type_text(e) for e in t)})"


@dataclass
class Instr:
    name: str
    line: int
    position: int  # in its computation
    type: HloType
    opcode: str
    operands: list[str]
    attrs: dict[str, tuple[str, int]]  # name -> (raw text, line)
    root: bool = False
    literal: Any = None  # constant: a number's text, or nested lists of them
    index: int | None = None  # parameter(index)


@dataclass
class Computation:
    name: str
    line: int
    entry: bool
    instrs: dict[str, Instr] = field(default_factory=dict)
    root: Instr | None = None


@dataclass
class Module:
    name: str
    computations: dict[str, Computation]
    entry: Computation


class _Parser:
    def __init__(self, file: str, text: str):
        self.lex = _Lexer(file, text)

    def fail(self, pos: int, reason: str) -> CompileError:
        return self.lex.fail(pos, reason)

    def module(self) -> Module:
        lex = self.lex
        head = lex.next()
        if head.kind != "ident" or head.text != "HloModule":
            raise self.fail(head.start, f"expected 'HloModule <name>' first, got {_describe(head)}")
        name = lex.name("the module's name").text
        while lex.accept(","):
            self.attribute(f"module '{name}'")
        computations: dict[str, Computation] = {}
        while lex.peek().kind != "eof":
            entry = lex.accept_word("ENTRY")
            head = lex.name("a computation name (or 'ENTRY')")
            if not entry and head.text in DEBUG_TABLES and lex.peek().kind not in ("(", "{"):
                self.debug_table(head.text)
                continue
            comp = self.computation(entry, head)
            if comp.name in computations:
                raise CompileError(f"{lex.file}:{comp.line}: computation '{clip(comp.name)}' is defined twice "
                                   f"(first on line {computations[comp.name].line})")
            computations[comp.name] = comp
        if not computations:
            raise self.fail(len(lex.text), f"module '{clip(name)}' has no computations")
        entries = [c for c in computations.values() if c.entry]
        if len(entries) > 1:
            raise CompileError(f"{lex.file}:{entries[1].line}: a second ENTRY computation "
                               f"'{clip(entries[1].name)}' (the first is on line {entries[0].line})")
        entry = entries[0] if entries else list(computations.values())[-1]
        return Module(name, computations, entry)

    def attribute(self, where: str) -> tuple[str, str, int]:
        lex = self.lex
        key = lex.name(f"an attribute name in {where}")
        lex.expect("=", f"'=' after '{clip(key.text)}'")
        text, line = lex.raw(f"attribute '{clip(key.text)}'")
        return key.text, text, line

    def debug_table(self, name: str) -> None:
        """Skip a table of source locations, its rows `<id> "text"` or `<id> {...}` (none: an
        empty table)."""
        lex = self.lex
        while lex.peek().kind == "number":
            row = lex.next().text
            lex.raw(f"row {clip(row)} of table {name}")

    def computation(self, entry: bool, head: _Token) -> Computation:
        lex = self.lex
        comp = Computation(head.text, lex.line(head.start), entry)
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
        lex.expect("{", f"'{{' to open computation '{clip(comp.name)}'")
        while not lex.accept("}"):
            if lex.peek().kind == "eof":
                raise self.fail(head.start, f"computation '{clip(comp.name)}' is not closed with '}}'")
            self.instruction(comp)
        while lex.accept(","):  # execution_thread="..."
            self.attribute(f"computation '{comp.name}'")
        if not comp.instrs:
            raise CompileError(f"{lex.file}:{comp.line}: computation '{clip(comp.name)}' has no instructions")
        if comp.root is None:
            comp.root = list(comp.instrs.values())[-1]
        return comp

    def instruction(self, comp: Computation) -> None:
        lex = self.lex
        root = lex.accept_word("ROOT")
        head = lex.name("an instruction name")
        line = lex.line(head.start)
        lex.expect("=", f"'=' after '{clip(head.text)}'")
        type_ = self.type()
        opcode = lex.expect("ident", "an opcode")
        ins = Instr(head.text, line, len(comp.instrs), type_, opcode.text, [], {}, root)
        lex.expect("(", f"'(' after the opcode '{clip(opcode.text)}'")
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
                raise CompileError(f"{lex.file}:{at}: '{clip(ins.name)}': attribute '{clip(key)}' is given twice")
            ins.attrs[key] = (text, at)
        if ins.name in comp.instrs:
            raise CompileError(f"{lex.file}:{line}: '{clip(ins.name)}' is defined twice in computation "
                               f"'{clip(comp.name)}' (first on line {comp.instrs[ins.name].line})")
        if root:
            if comp.root is not None:
                raise CompileError(f"{lex.file}:{line}: a second ROOT in computation '{clip(comp.name)}' "
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

    def type(self, depth: int = 0) -> HloType:
        lex = self.lex
        if lex.peek().kind == "(":
            if depth >= MAX_TUPLE_DEPTH:
                raise self.fail(lex.peek().start, f"tuple shapes nested deeper than {MAX_TUPLE_DEPTH} levels")
            lex.next()
            elements: list[HloType] = []
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
        layout, tiled = lex.layout(len(dims))
        problem = shape_problem(dims)
        if problem:
            raise self.fail(token.start, f"shape {token.text}{dims}: {problem}")
        return Shape(token.text, tuple(dims), layout, tiled)

    def int(self, token: _Token, what: str) -> int:
        if not INT_TEXT.fullmatch(token.text) or len(token.text.lstrip("-")) > MAX_INT_DIGITS:
            raise self.fail(token.start, f"bad {what} '{clip(token.text)}'")
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


def int_value(text: str) -> int | None:
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else None


def int_list(text: str) -> list[int] | None:
    """`{1,0}` -> [1, 0]; None when the text is not such a list (or a number is too long)."""
    if not _INT_LIST.fullmatch(text):
        return None
    values = [int_value(v) for v in re.findall(r"-?[0-9]+", text)]
    return None if None in values else values  # type: ignore[return-value]




def read_module(path: str, text: str) -> Module:
    """The module in `text` (the file `path`, which names it in messages)."""
    return _Parser(path, text).module()
