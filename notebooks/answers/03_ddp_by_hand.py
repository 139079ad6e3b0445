"""Chapter 03's reference answers. The rung scripts (scripts/by_hand/<rung>.py) are the reference; an exercise's
answer is its skeleton (scripts/by_hand/skeletons/<rung>.py) with every function left blank filled in from the rung
of the same name: the given parts stay the skeleton's, so the answer also checks that skeleton and rung agree.
Read only by the solution cells, which run only with SOLUTIONS = True."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
BY_HAND = ROOT / "scripts" / "by_hand"


def _functions(tree) -> dict:
    """{name: node} of a module's functions and its classes' methods ("Class.method")."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            out.update({f"{node.name}.{sub.name}": sub for sub in node.body if isinstance(sub, ast.FunctionDef)})
    return out


def _is_stub(node) -> bool:
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return (
        len(body) == 1
        and isinstance(body[0], ast.Raise)
        and body[0].exc is not None
        and getattr(getattr(body[0].exc, "func", body[0].exc), "id", None) == "NotImplementedError"
    )


def solution_source(rung: str, functions_only: bool = False) -> str:
    """Exercise `rung`'s skeleton with its blanks filled from the rung's script. functions_only: only the filled
    functions, after the skeleton's imports (exercise 4's cell holds just gather and free)."""
    skeleton = (BY_HAND / "skeletons" / f"{rung}.py").read_text()
    reference = (BY_HAND / f"{rung}.py").read_text().splitlines(keepends=True)
    ref = _functions(ast.parse("".join(reference)))
    lines = skeleton.splitlines(keepends=True)
    blanks = [(name, node) for name, node in _functions(ast.parse(skeleton)).items() if _is_stub(node)]
    for name, node in sorted(blanks, key=lambda item: -item[1].lineno):  # from the bottom: line numbers hold
        lines[node.lineno - 1 : node.end_lineno] = reference[ref[name].lineno - 1 : ref[name].end_lineno]
    if functions_only:
        imports = "".join(l for l in skeleton.splitlines(keepends=True) if l.startswith(("import ", "from ")))
        bodies = ["".join(reference[ref[name].lineno - 1 : ref[name].end_lineno]) for name, _ in blanks]
        return imports + "\n\n" + "\n\n".join(bodies)
    return "".join(lines)


def write_solution(rung: str, path) -> Path:
    """Write exercise `rung`'s answer where the learner's file would go; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(solution_source(rung, functions_only=rung == "zero3"))
    return path


def bucket_count(sizes, cap_bytes) -> int:
    """How many buckets the stated rule makes of gradients of these sizes (bytes), walked in reverse order: a bucket
    closes once it holds at least the cap (the last one may hold less)."""
    count, size = 0, 0
    for s in reversed(sizes):
        size += s
        if size >= cap_bytes:
            count, size = count + 1, 0
    return count + (size > 0)
