"""rk.config: the environment parsed once, bad values named, options set in
code, and the consumers that read them (the C kernels' loader, distributed
init; the allocator and the oneDNN routing have tests of their own)."""

import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest

import reckeras as rk
from reckeras import distributed
from reckeras.backend_kernels import cpu_native
from reckeras.config import Options


def test_an_empty_environment_gives_the_defaults():
    options = Options.from_environment({"PATH": "/bin", "RECKERAS_TIMEOUT_S": ""})
    assert options == Options()
    assert (options.malloc_tuning, options.onednn_dense, options.native_kernels,
            options.native_sanitize) == (True, True, None, False)
    assert options.cache_dir == pathlib.Path.home() / ".cache" / "reckeras"
    assert (options.timeout_s, options.ranks_per_node) == (300.0, None)


def test_every_variable_is_parsed():
    options = Options.from_environment({
        "RECKERAS_MALLOC_TUNING": "0", "RECKERAS_ONEDNN_DENSE": "off",
        "RECKERAS_NATIVE": "False", "RECKERAS_NATIVE_SANITIZE": "1",
        "RECKERAS_CACHE_DIR": "/tmp/rk-cache", "RECKERAS_TIMEOUT_S": "12.5",
        "RECKERAS_RANKS_PER_NODE": "4"})
    assert options == Options(malloc_tuning=False, onednn_dense=False,
                              native_kernels=False, native_sanitize=True,
                              cache_dir=pathlib.Path("/tmp/rk-cache"), timeout_s=12.5,
                              ranks_per_node=4)
    for text in ("1", "true", "YES", "On"):
        assert Options.from_environment({"RECKERAS_MALLOC_TUNING": text}).malloc_tuning


@pytest.mark.parametrize("variable,text,message", [
    ("RECKERAS_MALLOC_TUNING", "maybe", "RECKERAS_MALLOC_TUNING='maybe' is not a boolean"),
    ("RECKERAS_NATIVE", "2", "RECKERAS_NATIVE='2' is not a boolean"),
    ("RECKERAS_TIMEOUT_S", "5min", "RECKERAS_TIMEOUT_S='5min' is not a number of seconds"),
    ("RECKERAS_TIMEOUT_S", "-5", r"timeout_s \(RECKERAS_TIMEOUT_S\) must be a positive"),
    ("RECKERAS_RANKS_PER_NODE", "two", "RECKERAS_RANKS_PER_NODE='two' is not a whole"),
    ("RECKERAS_RANKS_PER_NODE", "0", r"ranks_per_node \(RECKERAS_RANKS_PER_NODE\) must be"),
])
def test_a_bad_value_names_its_variable(variable, text, message):
    with pytest.raises(ValueError, match=message):
        Options.from_environment({variable: text})


def run(code, **env):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RECKERAS_")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**environment, **env}, timeout=120)


def test_the_environment_is_read_once_at_first_use():
    # A bad value does not break `import reckeras`: nothing reads it there.
    result = run("import reckeras as rk\nprint('imported', flush=True)\n"
                 "rk.config.options()", RECKERAS_TIMEOUT_S="soon")
    assert result.stdout.strip() == "imported"
    assert "RECKERAS_TIMEOUT_S='soon' is not a number of seconds" in result.stderr
    result = run("import os, reckeras as rk\n"
                 "first = rk.config.options().timeout_s\n"
                 "os.environ['RECKERAS_TIMEOUT_S'] = '99'\n"
                 "print(first, rk.config.options().timeout_s)", RECKERAS_TIMEOUT_S="7")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["7.0", "7.0"]


def test_options_are_set_in_code_and_read_back(monkeypatch):
    monkeypatch.delenv("RECKERAS_MALLOC_TUNING", raising=False)
    rk.config.set(malloc_tuning=False, cache_dir="/tmp/elsewhere")
    assert rk.config.options().malloc_tuning is False
    assert rk.config.options().cache_dir == pathlib.Path("/tmp/elsewhere")
    assert rk.config.options().timeout_s == Options().timeout_s      # the others kept
    assert "RECKERAS_MALLOC_TUNING" not in os.environ                 # env untouched
    rk.config.set(malloc_tuning=True)
    assert rk.config.options().malloc_tuning is True


def test_an_unknown_option_or_a_bad_value_is_refused():
    before = rk.config.options()
    with pytest.raises(ValueError, match="no option 'maloc_tuning'; the options are "
                                         "malloc_tuning, onednn_dense"):
        rk.config.set(maloc_tuning=False)
    with pytest.raises(ValueError, match=r"malloc_tuning \(RECKERAS_MALLOC_TUNING\) must "
                                         r"be True or False, got 0"):
        rk.config.set(malloc_tuning=0)
    with pytest.raises(ValueError, match="ranks_per_node .* must be a positive int"):
        rk.config.set(ranks_per_node=2.0)
    assert rk.config.options() == before                       # nothing half-set
    with pytest.raises(dataclasses.FrozenInstanceError):
        rk.config.options().malloc_tuning = False


def test_native_kernels_off_loads_the_torch_references(monkeypatch):
    monkeypatch.setattr(cpu_native, "_library", None)      # as before the first call
    monkeypatch.setattr(cpu_native, "_failed", False)
    rk.config.set(native_kernels=False)
    assert cpu_native.library() is None


def test_distributed_init_takes_its_defaults_from_the_options(monkeypatch):
    monkeypatch.setattr(distributed, "_world", distributed._world)   # restored after
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    rk.config.set(timeout_s=42.0)
    assert distributed.init().timeout_s == 42.0
    assert distributed.init(timeout_s=5).timeout_s == 5.0            # an argument wins
    rk.config.set(ranks_per_node=2)
    with pytest.raises(ValueError, match="ranks_per_node=2 must divide the world size 1"):
        distributed.init()
