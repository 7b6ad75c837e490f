"""Shared fixtures for the fp8ref Python tests.

The CLI comes from $FP8REF_CLI (set by ctest), else <repo>/build/fp8ref; the tests are skipped cleanly when it
is missing. `fp8ref` runs it: fp8ref("convert", "--from", "f32", ...) -> subprocess.CompletedProcess (text).
"""
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _cli_path():
    env = os.environ.get("FP8REF_CLI")
    return pathlib.Path(env) if env else REPO / "build" / "fp8ref"


@pytest.fixture(scope="session")
def cli_path():
    path = _cli_path()
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"fp8ref CLI not found at {path} (build it, or set FP8REF_CLI)")
    return str(path)


@pytest.fixture(scope="session")
def fp8ref(cli_path):
    def run(*args, check=False):
        proc = subprocess.run([cli_path, *map(str, args)], capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"fp8ref {' '.join(map(str, args))} exited {proc.returncode}\nstderr: {proc.stderr}")
        return proc

    return run


@pytest.fixture(scope="session")
def test_data():
    env = os.environ.get("FP8REF_TEST_DATA")
    return pathlib.Path(env) if env else REPO / "tests" / "data"
