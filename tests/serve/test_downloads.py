"""The page's translated files stay within ``serve/downloads.py``'s count and size: Gradio serves them from that
folder, and copies none into its own cache (``GRADIO_TEMP_DIR``), which no bound of ours would reach."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from gradio.processing_utils import move_files_to_cache
from gradio.utils import get_upload_folder

from aiayn.engines.options import EngineOptions
from aiayn.serve.limits import Limits
from aiayn.serve.page import build_app
from aiayn.serve.service import TranslationService


def test_a_translated_file_is_served_from_the_downloads_folder_never_copied_into_gradios_cache(
    bundled: dict[str, Path],
) -> None:
    app = build_app(TranslationService(EngineOptions(device="cpu")), ["en-de"], Limits(downloads_kept=2))
    (translate_file,) = [fn for fn in app.fns.values() if fn.api_name == "translate_file"]
    (download,) = translate_file.outputs
    uploads = Path(tempfile.mkdtemp(dir=get_upload_folder()))  # where the page takes uploads from
    outs = []
    for number in range(3):
        upload = uploads / f"lines{number}.txt"
        upload.write_text("A dog runs.\n", encoding="utf-8")
        out = translate_file.fn({"path": str(upload)}, "en-de", 1)
        served = move_files_to_cache(download.postprocess(out), download, postprocess=True)  # as Gradio answers it
        assert Path(served["path"]).resolve() == Path(out).resolve()  # the file itself: no copy elsewhere
        outs.append(Path(out))
    shutil.rmtree(uploads)
    assert [out.exists() for out in outs] == [False, True, True]  # the downloads' bound deletes what Gradio serves
