"""Shipped as real software: licence and metadata, one version, a complete sdist,
a release extension without debug information, the cibuildwheel configuration, and typed
public signatures (``test_docs.py`` checks that the API reference names every public name).

The sdist test builds the source distribution from this checkout and compares it with the
files git tracks; CI (``.ci/run``) goes further: it installs the sdist in a fresh virtual
environment and runs its tests there, and smoke-tests the built wheel in another.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

import specdec_np
from specdec_np import _core, _version, cli, registry, testing

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(specdec_np.__file__).resolve().parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


# -- licence, metadata, version --------------------------------------------------------------


def test_the_licence_is_apache_2_0() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "Copyright 2026 the specdec_np authors" in text
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]


def test_the_metadata_is_complete() -> None:
    for key in ("description", "readme", "requires-python", "authors", "keywords", "urls"):
        assert PROJECT.get(key), key
    assert set(PROJECT["urls"]) >= {"Homepage", "Documentation", "Repository", "Issues"}
    classifiers = PROJECT["classifiers"]
    assert "Typing :: Typed" in classifiers and (PACKAGE / "py.typed").exists()
    # PEP 639: the licence expression replaces licence classifiers.
    assert not any(c.startswith("License ::") for c in classifiers)


def test_one_version_string() -> None:
    """The version is written once (specdec_np/_version.py): the build reads it, the
    package re-exports it, and the installed metadata and the command line agree."""
    assert "version" not in PROJECT and PROJECT["dynamic"] == ["version"]
    source = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert source == {"attr": "specdec_np._version.__version__"}
    assert specdec_np.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", specdec_np.__version__)
    assert importlib.metadata.version("specdec_np") == specdec_np.__version__
    written = [
        path.name
        for path in PACKAGE.glob("*.py")
        if re.search(r'^__version__ = "', path.read_text(), re.MULTILINE)
    ]
    assert written == ["_version.py"]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0


def test_the_changelog_has_this_version_and_an_unreleased_section() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text
    assert re.search(rf"^## \[{re.escape(specdec_np.__version__)}\] - \d{{4}}-\d\d-\d\d$",
                     text, re.MULTILINE)


def test_the_python_versions_agree() -> None:
    """requires-python, the classifiers and the cibuildwheel selectors name the same
    CPython versions."""
    minimum = re.fullmatch(r">=3\.(\d+)", PROJECT["requires-python"])
    assert minimum
    classified = sorted(
        int(m[1]) for c in PROJECT["classifiers"] if (m := re.fullmatch(r".*:: 3\.(\d+)", c))
    )
    built = sorted(int(m) for m in re.findall(r"cp3(\d+)-", PYPROJECT["tool"]["cibuildwheel"]
                                              ["build"]))  # fmt: skip
    assert classified == built and classified[0] == int(minimum[1])
    assert classified == list(range(classified[0], classified[-1] + 1))


def test_cibuildwheel_builds_manylinux_and_runs_the_fast_tests() -> None:
    config = PYPROJECT["tool"]["cibuildwheel"]
    assert "manylinux" in config["build"] and "musllinux" in config["skip"]
    assert set(PYPROJECT["tool"]["cibuildwheel"]["linux"]["archs"]) == {"x86_64", "aarch64"}
    assert 'not slow' in config["test-command"]
    # The tests run from a copy of these, against the installed wheel.
    for path in config["test-sources"]:
        assert (ROOT / path).exists(), path


# -- the sdist -------------------------------------------------------------------------------

# Tracked files that neither the build nor the tests need: the CI scripts and git's own.
NOT_IN_SDIST = re.compile(r"^\.ci/|^\.gitignore$")


def _tracked_files() -> set[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist): nothing to compare with")
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    # Files added to the index but deleted from the work tree are not the checkout's.
    return {name for name in listed if (ROOT / name).exists()}


@pytest.mark.slow  # cythonizes a fresh copy of the sources
def test_the_sdist_holds_every_tracked_file(tmp_path: Path) -> None:
    """``python -m build --sdist``: every file git tracks, except the CI script and the git
    configuration, and no build output (generated C, shared objects, caches)."""
    tracked = _tracked_files()
    pytest.importorskip("build")
    # From a copy of the tracked files only: setuptools adds the files listed in a stale
    # specdec_np.egg-info/SOURCES.txt of the checkout, which would hide a missing entry.
    source = tmp_path / "source"
    for name in tracked:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    completed = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path),
         str(source)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    (archive,) = tmp_path.glob("specdec_np-*.tar.gz")
    assert archive.name == f"specdec_np-{specdec_np.__version__}.tar.gz"
    with tarfile.open(archive) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    missing = sorted(name for name in tracked - names if not NOT_IN_SDIST.search(name))
    assert not missing, f"tracked files missing from the sdist: {missing}"
    build_outputs = re.compile(r"(\.so|\.pyd|\.py[co]|_core\.c|_core\.html)$|__pycache__|^build/")
    shipped_outputs = sorted(name for name in names if build_outputs.search(name))
    assert not shipped_outputs, f"build outputs in the sdist: {shipped_outputs}"


# -- the extension carries no debug information ----------------------------------------------


def _elf_section_names(path: Path) -> set[str]:
    """The section names of a 64-bit little-endian ELF file."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not a 64-bit LE ELF"
    section_offset = int.from_bytes(data[0x28:0x30], "little")
    entry_size = int.from_bytes(data[0x3A:0x3C], "little")
    count = int.from_bytes(data[0x3C:0x3E], "little")
    names_index = int.from_bytes(data[0x3E:0x40], "little")

    def header(index: int) -> tuple[int, int]:
        start = section_offset + index * entry_size
        return (int.from_bytes(data[start : start + 4], "little"),
                int.from_bytes(data[start + 0x18 : start + 0x20], "little"))  # fmt: skip

    names_offset = header(names_index)[1]
    names = set()
    for index in range(count):
        name_offset = names_offset + header(index)[0]
        names.add(data[name_offset : data.index(b"\0", name_offset)].decode("ascii"))
    return names


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF sections: Linux builds")
def test_the_release_extension_carries_no_debug_information() -> None:
    """setup.py builds the release extension with -g0 and strips it at link time; the debug
    build (SPECDEC_DEBUG=1) keeps its debug sections."""
    sections = _elf_section_names(Path(_core.__file__))
    debug_sections = {name for name in sections if name.startswith(".debug")}
    if _core.debug_build():
        assert ".debug_info" in debug_sections
    else:
        assert not debug_sections and ".symtab" not in sections, sorted(sections)


# -- the signatures of the public API --------------------------------------------------------

PUBLIC_MODULES = {specdec_np: "specdec_np", registry: "specdec_np.registry",
                  testing: "specdec_np.testing"}  # fmt: skip


def _public_names() -> list[tuple[Any, str, str]]:
    return [
        (module, prefix, name)
        for module, prefix in PUBLIC_MODULES.items()
        for name in module.__all__
        if name not in ("__version__", "registry")
    ]


def _callables() -> list[tuple[str, Any]]:
    found = []
    for module, prefix, name in [*_public_names(), (cli, "specdec_np.cli", "main"),
                                 (cli, "specdec_np.cli", "build_parser")]:  # fmt: skip
        value = getattr(module, name)
        if inspect.isclass(value):
            for member_name, member in vars(value).items():
                if isinstance(member, property):
                    member = member.fget
                public = not member_name.startswith("_") or member_name in ("__init__", "__call__")
                if public and inspect.isfunction(member):
                    found.append((f"{prefix}.{name}.{member_name}", member))
        elif inspect.isfunction(value):
            found.append((f"{prefix}.{name}", value))
    return found


def test_every_public_function_has_a_typed_signature() -> None:
    """Every parameter and every return of the public functions and methods is annotated,
    so that type checkers and the API reference show the signature."""
    untyped = []
    for name, function in _callables():
        signature = inspect.signature(function)
        for parameter in signature.parameters.values():
            if parameter.name not in ("self", "cls") and parameter.annotation is parameter.empty:
                untyped.append(f"{name}({parameter.name})")
        if signature.return_annotation is signature.empty:
            untyped.append(f"{name} -> ?")
    assert not untyped, untyped
    assert len(_callables()) > 60  # the walk found the public surface
