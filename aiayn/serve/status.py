"""What a translation tells beside its text, worded once for the page (one status line) and for `aiayn
translate` (one line each on stderr). Torch-free."""

from __future__ import annotations

from aiayn.serve.service import Result

SHOWN = 20  # characters or line numbers named per note; the rest are left out of the message


def notes(
    left_out: list[str], unchanged: int, short: list[int], unsure: list[int], refused: list[tuple[int, str]]
) -> list[str]:
    """One note per thing to tell: ``short``, ``unsure`` and ``refused`` name lines counted from 1."""
    found = []
    if left_out:
        found.append("not in the model's vocabulary, left out: " + " ".join(left_out[:SHOWN]))
    if unchanged:
        found.append(f"{unchanged} sentence(s) without a known word kept as they are")
    if short:
        found.append(f"line(s) {numbers(short)}: the translation looks short for its source, a part may be missing")
    if unsure:
        found.append(f"line(s) {numbers(unsure)}: the model is unsure of this translation, check it")
    return found + [f"line {line} not translated: {reason}" for line, reason in refused]


def numbers(lines: list[int]) -> str:
    more = f" and {len(lines) - SHOWN} more" if len(lines) > SHOWN else ""
    return ", ".join(str(n) for n in lines[:SHOWN]) + more


def status_line(result: Result) -> str:
    """The page's and the API's second output: sentences, latency and provider, then the notes."""
    if not result.sentences:
        return f"Nothing to translate · {result.provider}"
    done = f"{result.sentences} sentence(s) in {result.latency_ms:.0f} ms on {result.provider}"
    return " · ".join([done, *notes(*from_one(result))])


def from_one(result: Result) -> tuple[list[str], int, list[int], list[int], list[tuple[int, str]]]:
    """``notes``' arguments for one result, its lines counted from 1."""
    return (
        result.left_out,
        result.unchanged,
        [line + 1 for line in result.short_lines],
        [line + 1 for line in result.unsure_lines],
        [(line + 1, reason) for line, reason in result.refused],
    )


def refused_line(message: str) -> str:
    """The status of a request that was not translated (the page's API answers it, not raises it: see page.py)."""
    return f"not translated: {message}"
