"""The sandboxed side of a tool call; run as ``python -I -S _sandbox_child.py MODE CPU_S MEM MAXC``.

Standard library only (it runs without site-packages). It limits itself before reading the code:
address space, CPU seconds, no new processes, no file writes, few descriptors, no core dumps.
Then it evaluates stdin under MODE — ``calc``: an AST-whitelisted arithmetic evaluator (no
``eval``); ``py``: one Python expression with restricted builtins and no underscore names — and
writes one JSON line ``{"ok": bool, "out": str}`` to stdout.
"""

import ast
import builtins
import json
import math
import operator
import resource
import sys
from typing import Any

_BIN: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Any] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS: dict[str, Any] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "floor": math.floor,
    "ceil": math.ceil,
}
_SAFE_BUILTINS = {
    name: getattr(builtins, name)
    for name in (
        "abs",
        "all",
        "any",
        "bin",
        "bool",
        "chr",
        "dict",
        "divmod",
        "enumerate",
        "filter",
        "float",
        "hex",
        "int",
        "isinstance",
        "len",
        "list",
        "map",
        "max",
        "min",
        "oct",
        "ord",
        "pow",
        "range",
        "repr",
        "reversed",
        "round",
        "set",
        "sorted",
        "str",
        "sum",
        "tuple",
        "zip",
    )
}

# Frame, code and traceback attributes lead back to real globals; format strings reach attributes.
_BANNED_PREFIXES = ("_", "gi_", "cr_", "ag_", "f_", "co_", "tb_")
_BANNED = frozenset({"format", "format_map", "mro"})


def limit(cpu_s: int, mem_bytes: int) -> None:
    """Apply the resource limits to this process (and anything it could start)."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (8, 8))


def calc(node: ast.AST) -> Any:
    """Evaluate an arithmetic AST: numbers, + - * / // % **, unary +/-, a few functions."""
    if isinstance(node, ast.Expression):
        return calc(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = calc(node.left), calc(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 1000 or abs(left) > 10**6):
            raise ValueError("exponent or base too large for the calculator")
        return _BIN[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](calc(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
    ):
        return _FUNCS[node.func.id](*[calc(a) for a in node.args])
    raise ValueError(f"not allowed in the calculator: {type(node).__name__}")


def python(tree: ast.Expression) -> object:
    """Evaluate one expression with restricted builtins, refusing dunder and introspection names.

    This is a speed bump, not the boundary: the resource limits and the isolated process are.
    """
    for node in ast.walk(tree):
        name = getattr(node, "id", None) or getattr(node, "attr", None) or ""
        if isinstance(name, str) and (name.startswith(_BANNED_PREFIXES) or name in _BANNED):
            raise ValueError(f"not allowed in the Python tool: {name}")
    return eval(compile(tree, "<py>", "eval"), {"__builtins__": _SAFE_BUILTINS}, {})


def show(value: object) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def main() -> None:
    mode, cpu_s, mem, max_chars = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    limit(cpu_s, mem)
    code = sys.stdin.read(max_chars * 4 + 64)
    try:
        tree = ast.parse(code.strip(), mode="eval")
        out, ok = show(calc(tree) if mode == "calc" else python(tree)), True
    except MemoryError:
        out, ok = "MemoryError: the memory limit was reached", False
    except Exception as e:  # every failure of the tool is the agent's observation
        out, ok = f"{type(e).__name__}: {e}", False
    if len(out) > max_chars:
        out = out[:max_chars] + f"... [{len(out) - max_chars} more characters]"
    sys.stdout.write(json.dumps({"ok": ok, "out": out}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
