"""The releases of each dependency that the suite passed on: one table, which `aiayn translate` and `aiayn serve`
check the installed releases against at start (one line on stderr names those outside), and which
pyproject.toml's and requirements.txt's ranges must equal (tests/core/test_dependencies.py compares them).

The oldest release of each is the one the suite was run with (none older was tried); an upper bound stands only
where a release is known to change what the project relies on. Torch-free, and no import of the packages named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version


@dataclass(frozen=True)
class Tested:
    oldest: str  # the oldest release the suite passed on
    before: str | None = None  # the first release known to change what we rely on
    also: tuple[str, ...] = ()  # other distributions that install the same package

    @property
    def specifier(self) -> str:
        return f">={self.oldest}" + (f",<{self.before}" if self.before else "")

    def holds(self, release: str) -> bool:
        number = release_number(release)
        return release_number(self.oldest) <= number and (self.before is None or number < release_number(self.before))


TESTED: dict[str, Tested] = {
    "numpy": Tested("2.4.6"),
    "tokenizers": Tested("0.23.3"),
    "sacrebleu": Tested("2.6.0"),
    "tqdm": Tested("4.70.1"),
    # MatMulNBits' accuracy level and GatherBlockQuantized (the w8/w4 serving graphs); the CPU wheel or the CUDA one
    "onnxruntime": Tested("1.31.1", also=("onnxruntime-gpu",)),
    "onnx": Tested("1.23.2"),
    "safetensors": Tested("0.8.0"),
    # The page's queue, batching and sessions (docs/serve.md); Gradio 7 may change any of them.
    "gradio": Tested("6.31", "7"),
    "sentencex": Tested("1.0.32"),
    "prometheus-client": Tested("0.26.0"),  # `aiayn serve`'s GET /metrics
    "py3langid": Tested("0.4.0"),  # LibreTranslate's source "auto" and /detect
}
PAGE_ONLY = ("gradio",)  # what `aiayn translate` never imports
# Floors an extra's range holds for a fix the project relies on, not for the suite's runs (it ran on torch 2.13.0):
# before torch 2.6 a pickle can run code through ``torch.load(weights_only=True)`` (CVE-2025-32434), and every
# checkpoint is read that way (``aiayn.model.weights.read_tensor_pickle``); datasets takes ``trust_remote_code``
# from 2.16 on (``aiayn.data.hf_datasets``). Each refuses a release under its floor where it reads.
SECURITY_FLOORS: dict[str, str] = {"torch": "2.6", "datasets": "2.16"}


def release_number(release: str) -> tuple[int, ...]:
    """"6.31.0" → (6, 31, 0); a part's trailing letters (rc1, .post1, +cpu) are left out."""
    return tuple(int(match.group()) for part in release.split(".") if (match := re.match(r"\d+", part)))


def installed(name: str) -> tuple[str, str] | None:
    """(distribution, release) of the table's ``name`` as installed, under its own name or another's; None if
    absent."""
    for distribution in (name, *TESTED[name].also):
        try:
            return distribution, version(distribution)
        except PackageNotFoundError:
            continue
    return None


def untested_line(names: tuple[str, ...] = tuple(TESTED), releases: dict[str, str] | None = None) -> str | None:
    """One line naming each of ``names`` installed outside its tested range, with the install that fixes them; None
    when all hold. ``releases`` (default: as installed) maps a distribution, the table's name or an ``also``, to its
    release."""
    if releases is None:
        releases = dict(found for name in names if (found := installed(name)) is not None)
    outside = [
        (distribution, release, TESTED[name])
        for name in names
        for distribution in (name, *TESTED[name].also)
        if (release := releases.get(distribution)) is not None and not TESTED[name].holds(release)
    ]
    if not outside:
        return None
    named = ", ".join(f"{dist} {release} (tested {tested.specifier})" for dist, release, tested in outside)
    fix = " ".join(f"'{dist}{tested.specifier}'" for dist, _, tested in outside)
    return f"warning: outside the releases this was tested with: {named}; pip install {fix}"
