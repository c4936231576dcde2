"""Hugging Face Spaces entry point: the translation page on the bundled models (ONNX Runtime and NumPy, no torch).

A Space runs `python app.py` and sends its visitors to port 7860 (GRADIO_SERVER_PORT elsewhere); it listens on
every interface only where Spaces runs it (`space_host`), elsewhere on 127.0.0.1, as `aiayn serve` does.
"""

import os

from aiayn.serve.server import serve, space_host

if __name__ == "__main__":
    serve(None, host=space_host(), port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
