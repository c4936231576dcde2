"""The page and the engines use Gradio and ONNX Runtime through their public APIs only: a release may change
anything private without notice, and a patch of it would then break silently (the queue's bound, the waits,
a bad request's answer)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# In a module that uses Gradio or ONNX Runtime: a private attribute (one underscore) of any object but its own,
# and Gradio's modules that its documentation does not name (its queue, server messages, data classes, routes).
UNDOCUMENTED = "queueing|server_messages|data_classes|route_utils|routes"
PRIVATE = re.compile(rf"(?<!self)\.(_[a-z]\w*)\b|from gradio\.({UNDOCUMENTED})\b")
USES = re.compile(r"^\s*(import|from) (gradio|gradio_client|onnxruntime)\b", re.MULTILINE)


def sources() -> list[Path]:
    every = [*sorted((ROOT / "aiayn").rglob("*.py")), ROOT / "app.py", *sorted((ROOT / "tests").rglob("*.py"))]
    return [path for path in every if USES.search(path.read_text(encoding="utf-8"))]


def test_no_private_attribute_of_gradio_or_onnx_runtime_is_used() -> None:
    this = Path(__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sources()
        if path.resolve() != this
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if PRIVATE.search(line)
    ]
    assert found == []


def test_no_function_of_the_serving_package_is_over_60_lines() -> None:
    import ast

    long = [
        f"{path.name}:{node.name} has {node.end_lineno - node.lineno + 1} lines"
        for path in sorted((ROOT / "aiayn" / "serve").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
        if node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []
