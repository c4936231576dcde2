"""`aiayn bench --web`'s account of a page's first seconds: each part's median start and end, in the order the parts
end, and a table whose columns keep that order whatever order each folder's parts ended in."""

from __future__ import annotations

from aiayn.bench.web import median_parts, parts_table


def test_the_parts_are_medians_in_the_order_they_end_and_the_table_keeps_it() -> None:
    rounds = [
        {"weights": (10.0, 50.0), "encoder session": (50.0, 400.0), "runtime": (10.0, 30.0)},
        {"weights": (12.0, 70.0), "encoder session": (70.0, 300.0), "runtime": (12.0, 90.0)},
        {"weights": (11.0, 60.0), "encoder session": (60.0, 500.0), "runtime": (11.0, 40.0)},
    ]
    parts = median_parts(rounds)
    assert parts == {"runtime": (11.0, 40.0), "weights": (11.0, 60.0), "encoder session": (60.0, 400.0)}
    assert list(parts) == ["runtime", "weights", "encoder session"]  # the first round's order of ending
    other = {"encoder session": (5.0, 9.0), "weights": (1.0, 2.0), "runtime": (1.0, 4.0)}
    assert parts_table(["fp32", "w4"], [parts, other], "folder").splitlines() == [
        "| folder | runtime | weights | encoder session |",
        "|---|---|---|---|",
        "| fp32 | 11–40 | 11–60 | 60–400 |",
        "| w4 | 1–4 | 1–2 | 5–9 |",
    ]
