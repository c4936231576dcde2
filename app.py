"""Hugging Face Spaces entry point: the translation page on the bundled models (ONNX Runtime and NumPy, no torch).

A Space runs `python app.py` and sends its visitors to port 7860 (GRADIO_SERVER_PORT elsewhere); locally,
`aiayn serve` does the same on 127.0.0.1.
"""

import os

from aiayn.serve.server import serve

if __name__ == "__main__":
    serve(None, host="0.0.0.0", port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
