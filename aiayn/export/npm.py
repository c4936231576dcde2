"""The browser's libraries: pinned npm packages, fetched from the registry once, checked, and cached.

The web folder (``web.py``) copies a few files out of each package, so it works offline and as a static
Space, and nobody needs Node: the tarballs come from the registry npm itself would use (``registry``: npm's
``npm_config_registry`` environment variable, else ``registry=`` in the project's ``.npmrc``, then the user's,
else the public npm registry; a package's scope may name its own, ``@scope:registry=``, with its ``_authToken``),
each refused unless its sha512 is the one pinned here (npm's ``dist.integrity``), whichever registry served it,
and are kept in a cache for the next export.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aiayn.core.outputs import write_file

DEFAULT_REGISTRY = "https://registry.npmjs.org/"  # npm's own default
CACHE_DIR = Path(os.environ.get("AIAYN_NPM_CACHE", Path.home() / ".cache" / "aiayn" / "npm"))


@dataclass(frozen=True)
class NpmPackage:
    name: str
    version: str
    integrity: str  # npm's dist.integrity: sha512 of the tarball, base64
    license: str  # SPDX, as its package.json says
    files: tuple[str, ...]  # paths inside the package that the page loads

    @property
    def tarball_name(self) -> str:
        return f"{self.name.rsplit('/', 1)[-1]}-{self.version}.tgz"

    @property
    def scope(self) -> str | None:
        return self.name.split("/", 1)[0] if self.name.startswith("@") else None

    def url(self, registry: str) -> str:
        """The tarball's address on ``registry``, in the layout npm's registries and their mirrors share."""
        return f"{registry.rstrip('/')}/{self.name}/-/{self.tarball_name}"


PACKAGES = (
    # ONNX Runtime's WASM build (its SIMD one; the page runs it on one thread, engine.js), and its WebGPU build for
    # the browsers that offer a WebGPU adapter (its WASM part is ONNX Runtime's asyncify build, 27 MB, fetched
    # only by those browsers).
    NpmPackage(
        "onnxruntime-web",
        "1.30.0",
        "sha512-q0y+JrrtukXSzsBWEMccVfqX25LRmosXHF+CaRJmg8pZClzcV7svNc4rKY3jL02Vb7QmRMDs1SigqR4CXAfKYQ==",
        "MIT",
        (
            "dist/ort.wasm.min.mjs",
            "dist/ort-wasm-simd-threaded.mjs",
            "dist/ort-wasm-simd-threaded.wasm",
            "dist/ort.webgpu.min.mjs",
            "dist/ort-wasm-simd-threaded.asyncify.mjs",
            "dist/ort-wasm-simd-threaded.asyncify.wasm",
        ),
    ),
    # tokenizers.js, the tokenizers of transformers.js, on its own: it reads tokenizer.json.
    NpmPackage(
        "@huggingface/tokenizers",
        "0.2.0",
        "sha512-LidMHe1FpcSYH4vcSjXooda34pC0M8m1gmDOv7SQi6Iv+ib1zX7J3sHBCC9/3FPCkn2k1b55FneVqMRxrr99pg==",
        "Apache-2.0",
        ("dist/tokenizers.min.mjs",),
    ),
    # Wikimedia's sentencex compiled to WASM: the Rust library under PyPI's sentencex 1.0.32, which cuts every
    # Multi30k line (en, de, fr, cs) exactly as it does (docs/onnx.md#the-browser).
    NpmPackage(
        "sentencex-wasm",
        "0.1.31",
        "sha512-fzHf8TMt3YNINIx+aF2NLnkY5JADmxhs/nGIyV7gen41n6YHuA8A8/oHVEg88IJ9lXV6TG0kvgwNJZiiRkVP4A==",
        "MIT",
        ("sentencex_wasm.js", "sentencex_wasm_bg.wasm"),
    ),
)


def npmrc_settings(environ: Mapping[str, str] = os.environ, project: Path | None = None) -> dict[str, str]:
    """npm's configuration as far as fetching goes, lowest precedence first: the user's ``.npmrc``
    (``NPM_CONFIG_USERCONFIG`` or ``~/.npmrc``), the project's (``project``, default: the working directory), then
    ``npm_config_*`` environment variables (either case). Values may hold ``${VAR}``, as npm allows."""
    user = Path(environ.get("NPM_CONFIG_USERCONFIG") or environ.get("npm_config_userconfig") or Path.home() / ".npmrc")
    settings: dict[str, str] = {}
    for path in (user, (project or Path.cwd()) / ".npmrc"):
        if path.is_file():
            settings.update(parse_npmrc(path.read_text(encoding="utf-8"), environ))
    for key, value in environ.items():
        if key.lower().startswith("npm_config_"):
            settings[key[len("npm_config_") :].lower().replace("_", "-")] = value
    return settings


def parse_npmrc(text: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``key=value`` lines of an ``.npmrc``; comments (``#``, ``;``) and blank lines skipped."""
    settings = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith(("#", ";")):
            value = re.sub(r"\$\{([^}]+)\}", lambda m: environ.get(m.group(1), ""), value.strip().strip("\"'"))
            settings[key.strip()] = value
    return settings


def registry_for(package: NpmPackage, settings: Mapping[str, str]) -> str:
    """The registry npm would fetch ``package`` from: its scope's, else the configured one, else npm's default."""
    scoped = settings.get(f"{package.scope}:registry") if package.scope else None
    return scoped or settings.get("registry") or DEFAULT_REGISTRY


def auth_headers(url: str, settings: Mapping[str, str]) -> dict[str, str]:
    """npm's per-registry token (``//host/path/:_authToken=``) whose path holds ``url``, as a bearer header."""
    bare = re.sub(r"^https?:", "", url)
    tokens = [
        (key, value)
        for key, value in settings.items()
        if key.startswith("//") and key.endswith(":_authToken") and bare.startswith(key.removesuffix(":_authToken"))
    ]
    return {"Authorization": f"Bearer {max(tokens, key=lambda token: len(token[0]))[1]}"} if tokens else {}


def tarball(package: NpmPackage, cache_dir: Path = CACHE_DIR, settings: Mapping[str, str] | None = None) -> bytes:
    """The package's tarball, from the cache or the configured registry (``npmrc_settings``), refused unless its
    sha512 is the pinned one."""
    cached = cache_dir / package.tarball_name
    if cached.is_file() and matches(cached.read_bytes(), package.integrity):
        return cached.read_bytes()
    settings = npmrc_settings() if settings is None else settings
    url = package.url(registry_for(package, settings))
    try:
        request = urllib.request.Request(url, headers=auth_headers(url, settings))
        with urllib.request.urlopen(request, timeout=120) as response:
            data = response.read()
    except (OSError, ValueError) as err:  # ValueError: a registry setting that is no URL
        raise FileNotFoundError(
            f"could not download {url} ({err}); check the connection and npm's registry setting "
            f"(npm_config_registry, or registry= in .npmrc), or put the file at {cached}"
        ) from None
    if not matches(data, package.integrity):
        raise ValueError(f"{url} is not the pinned {package.name} {package.version} (its sha512 differs)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    write_file(cached, data)
    return data


def matches(data: bytes, integrity: str) -> bool:
    algorithm, _, digest = integrity.partition("-")
    return base64.b64encode(hashlib.new(algorithm, data).digest()).decode() == digest


def copy_files(package: NpmPackage, out_dir: Path, cache_dir: Path = CACHE_DIR) -> list[Path]:
    """The package's ``files`` written flat into ``out_dir`` (npm tarballs hold them under ``package/``), and its
    LICENSE file where the tarball has one, as ``LICENSE.<package>.txt``."""
    written = []
    with tarfile.open(fileobj=io.BytesIO(tarball(package, cache_dir)), mode="r:gz") as archive:
        names = set(archive.getnames())
        for name in package.files:
            if f"package/{name}" not in names:
                raise ValueError(f"{package.name} {package.version} has no file {name}")
            written.append(extract(archive, f"package/{name}", out_dir / Path(name).name))
        if "package/LICENSE" in names:
            license_file = f"LICENSE.{package.name.rsplit('/', 1)[-1]}.txt"
            written.append(extract(archive, "package/LICENSE", out_dir / license_file))
    return written


def extract(archive: tarfile.TarFile, member: str, target: Path) -> Path:
    source = archive.extractfile(member)
    if source is None:  # a folder or a link, not a file
        raise ValueError(f"{member} in the npm tarball is not a file")
    target.write_bytes(source.read())
    return target
