"""Hugging Face Spaces entry point: the translation page on the bundled models (ONNX Runtime and NumPy, no torch).

A Space runs `python app.py` and sends its visitors to port 7860; locally, `aiayn serve` does the same on 127.0.0.1.
"""

from aiayn.serve.api import json_route
from aiayn.serve.app import build_app, launch
from aiayn.serve.memory import bound_server_memory
from aiayn.serve.service import TranslationService

if __name__ == "__main__":
    bound_server_memory()  # before any thread starts
    service = TranslationService(engine="onnx", device="auto")
    launch(build_app(service), host="0.0.0.0", port=7860, routes=[json_route(service)])
