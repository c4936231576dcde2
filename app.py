"""Hugging Face Spaces entry point: the translation page on the bundled models (ONNX Runtime, no torch)."""

from aiayn.serve.app import build_app
from aiayn.serve.service import TranslationService

if __name__ == "__main__":
    build_app(TranslationService(engine="onnx", device="auto")).launch(server_name="0.0.0.0")
