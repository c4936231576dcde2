"""Choosing an engine: the one that is installed when a command names none."""

from __future__ import annotations

import importlib.util

import pytest

from aiayn.engines import load


def test_the_installed_engine_is_torch_where_pytorch_is_else_onnx(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load.installed_engine() == "torch"  # the full install, as in this test environment

    def refused(name: str) -> None:
        raise ImportError(f"{name} is blocked")

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # the serve-only install
    assert load.installed_engine() == "onnx"
    monkeypatch.setattr(importlib.util, "find_spec", refused)
    assert load.installed_engine() == "onnx"
