"""native_build: where the C kernels are built, and what a missing compiler says."""

import os
import subprocess
import sys

import pytest

from reckeras.backend_kernels import native_build

PROBE = """
import warnings
from reckeras.backend_kernels import cpu_native
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        print(cpu_native.available())
    except RuntimeError as error:
        print("raised:", error)
for warning in caught:
    print("warned:", warning.message)
"""


def probe(tmp_path, **env):
    environ = {k: v for k, v in os.environ.items()
               if k not in ("CC", "RECKERAS_NATIVE", "RECKERAS_NATIVE_SANITIZE")}
    environ.update(RECKERAS_CACHE_DIR=str(tmp_path), **env)
    result = subprocess.run([sys.executable, "-c", PROBE], env=environ, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_missing_compiler_warns_naming_it_and_what_to_install(tmp_path):
    out = probe(tmp_path, CC="/nonexistent/rk-cc")
    assert out.startswith("False\nwarned: reckeras: native CPU kernels unavailable")
    assert "'/nonexistent/rk-cc' (CC) is not an executable on PATH" in out
    assert "apt-get install gcc" in out
    assert not list(tmp_path.iterdir())            # nothing half-built left behind


def test_a_missing_compiler_is_an_error_for_the_sanitized_build(tmp_path):
    out = probe(tmp_path, CC="/nonexistent/rk-cc", RECKERAS_NATIVE_SANITIZE="1")
    assert out.startswith("raised: reckeras: RECKERAS_NATIVE_SANITIZE=1 but the sanitized")
    assert "'/nonexistent/rk-cc' (CC) is not an executable" in out


def test_required_kernels_without_a_compiler_are_an_error_naming_it(tmp_path):
    out = probe(tmp_path, CC="/nonexistent/rk-cc", RECKERAS_NATIVE="1")
    assert out.startswith("raised: reckeras: native_kernels=True (RECKERAS_NATIVE=1) but")
    assert "'/nonexistent/rk-cc' (CC) is not an executable on PATH" in out
    assert "apt-get install gcc" in out


def test_kernels_turned_off_neither_build_nor_warn(tmp_path):
    assert probe(tmp_path, CC="/nonexistent/rk-cc", RECKERAS_NATIVE="0") == "False\n"
    assert not list(tmp_path.iterdir())


def test_a_failing_compiler_is_reported_with_its_command(tmp_path):
    out = probe(tmp_path, CC="false")                # runs, and exits 1
    assert out.startswith("False\nwarned: reckeras: native CPU kernels unavailable")
    assert "cpu_native.c" in out and "arrow_columns.c -o" in out and "failed (exit 1)" in out


def test_the_library_is_built_once_into_the_cache_dir(tmp_path):
    try:
        native_build.compiler()
    except native_build.BuildError:
        pytest.skip("no C compiler here")
    assert probe(tmp_path) == "True\n"
    built = sorted(p.name for p in tmp_path.iterdir())
    assert len(built) == 1 and built[0].startswith("cpu_native-") and \
        built[0].endswith(f"-{sys.platform}.so")
    assert probe(tmp_path) == "True\n"               # loaded from the cache
    assert sorted(p.name for p in tmp_path.iterdir()) == built


def test_compiler_names_the_default_when_cc_is_unset(monkeypatch):
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", "")
    with pytest.raises(native_build.BuildError,
                       match=r"no C compiler: 'cc' \(the default C compiler\) is not"):
        native_build.compiler()
