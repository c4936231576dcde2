"""The browser folder's npm files come from the registry npm is configured with (its environment, the project's and
the user's ``.npmrc``), the public one by default, and are refused unless their sha512 is the pinned one."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from aiayn.bench.web import served_folder
from aiayn.export.npm import (
    DEFAULT_REGISTRY,
    PACKAGES,
    NpmPackage,
    auth_headers,
    copy_files,
    npmrc_settings,
    registry_for,
    tarball,
)

SCOPED = next(p for p in PACKAGES if p.scope)  # @huggingface/tokenizers
PLAIN = next(p for p in PACKAGES if not p.scope)


def made_up_package() -> tuple[NpmPackage, bytes]:
    """A one-file package, its tarball and its pin, as a mirror would hold it."""
    content = b"export const answer = 42;\n"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        member = tarfile.TarInfo("package/index.mjs")
        member.size = len(content)
        archive.addfile(member, io.BytesIO(content))
    data = buffer.getvalue()
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    return NpmPackage("@made-up/answer", "1.0.0", integrity, "MIT", ("index.mjs",)), data


def test_the_registry_is_npms_default_unless_configured(tmp_path: Path) -> None:
    settings = npmrc_settings({"NPM_CONFIG_USERCONFIG": str(tmp_path / "none")}, project=tmp_path)
    assert registry_for(PLAIN, settings) == DEFAULT_REGISTRY
    assert PLAIN.url(DEFAULT_REGISTRY).endswith(f"/{PLAIN.name}/-/{PLAIN.tarball_name}")


def test_npm_settings_take_npms_precedence_and_its_scopes(tmp_path: Path) -> None:
    """The environment over the project's .npmrc over the user's; a scope's own registry for its packages."""
    user, project = tmp_path / "user.npmrc", tmp_path / "project"
    project.mkdir()
    user.write_text("registry=https://user.example/npm/\n; a comment\n", encoding="utf-8")
    (project / ".npmrc").write_text(
        f"# the company mirror\nregistry = ${{MIRROR}}/npm/\n{SCOPED.scope}:registry=https://scoped.example/\n",
        encoding="utf-8",
    )
    environ = {"NPM_CONFIG_USERCONFIG": str(user), "MIRROR": "https://mirror.example"}
    only_user = npmrc_settings(environ, project=tmp_path)
    assert registry_for(PLAIN, only_user) == "https://user.example/npm/"
    settings = npmrc_settings(environ, project=project)
    assert registry_for(PLAIN, settings) == "https://mirror.example/npm/"
    assert registry_for(SCOPED, settings) == "https://scoped.example/"
    for variable in ("npm_config_registry", "NPM_CONFIG_REGISTRY"):
        from_env = npmrc_settings({**environ, variable: "https://env.example/"}, project=project)
        assert registry_for(PLAIN, from_env) == "https://env.example/"


def test_the_token_of_the_registrys_own_path_is_sent() -> None:
    settings = {
        "//mirror.example/:_authToken": "host-wide",
        "//mirror.example/npm/:_authToken": "npm-path",
        "//elsewhere.example/:_authToken": "other",
    }
    assert auth_headers("https://mirror.example/npm/a/-/a-1.tgz", settings) == {"Authorization": "Bearer npm-path"}
    assert auth_headers("https://mirror.example/b/-/b-1.tgz", settings) == {"Authorization": "Bearer host-wide"}
    assert auth_headers("https://public.example/c/-/c-1.tgz", settings) == {}


def test_the_tarball_comes_from_the_configured_mirror_and_must_match_its_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package, data = made_up_package()
    site = tmp_path / "site"
    on_mirror = site / "npm" / package.name / "-" / package.tarball_name
    on_mirror.parent.mkdir(parents=True)
    on_mirror.write_bytes(data)
    with served_folder(site, isolated=False) as url:  # a plain mirror of npm files, no page
        monkeypatch.setenv("npm_config_registry", f"{url}npm/")  # as `npm config set registry` users have it
        (tmp_path / "out").mkdir()
        written = copy_files(package, tmp_path / "out", tmp_path / "cache")
        assert [p.read_bytes() for p in written] == [b"export const answer = 42;\n"]
        assert (tmp_path / "cache" / package.tarball_name).read_bytes() == data  # fetched once, then cached
        on_mirror.write_bytes(data + b"tampered")
        with pytest.raises(ValueError, match="sha512 differs"):
            tarball(package, tmp_path / "other-cache")
        with pytest.raises(FileNotFoundError, match="npm's registry setting"):
            tarball(package, tmp_path / "other-cache", {"registry": f"{url}nothing-here/"})
