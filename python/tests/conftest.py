"""Shared fixtures: the `lockstep` CLI (the independent oracle the tests compare with), the
source tree, and the backends to run on (CUDA cases skip without a CUDA build or device)."""

import json
import os
import pathlib
import subprocess

import pytest

import lockstep

SOURCE_DIR = pathlib.Path(os.environ.get("LOCKSTEP_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
PROMPTS = SOURCE_DIR / "examples" / "prompts.jsonl"


def _lockstep_bin():
    given = os.environ.get("LOCKSTEP_BIN")
    return pathlib.Path(given) if given else SOURCE_DIR / "build" / "lockstep"


def _backends():
    # LOCKSTEP_TEST_BACKENDS="cuda" runs only the CUDA cases (the H200 run); default: both.
    names = os.environ.get("LOCKSTEP_TEST_BACKENDS", "cpu,cuda").split(",")
    return [n for n in names if n]


def cuda_skip_reason():
    if not lockstep.has_cuda:
        return "this lockstep module has no CUDA backend"
    if not lockstep.cuda_device_available():
        return "no CUDA device"
    return None


@pytest.fixture(params=_backends())
def backend(request):
    if request.param == "cuda" and cuda_skip_reason():
        pytest.skip(cuda_skip_reason())
    return request.param


@pytest.fixture(scope="session")
def lockstep_bin():
    path = _lockstep_bin()
    if not path.exists():
        pytest.fail(f"the lockstep CLI is not at {path} (set LOCKSTEP_BIN)")
    return path.resolve()


def run_cli(lockstep_bin, *args, check=True):
    done = subprocess.run([str(lockstep_bin), *map(str, args)], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise AssertionError(f"lockstep {' '.join(map(str, args))} exited {done.returncode}:\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


def read_prompts(path=PROMPTS):
    return [json.loads(line) for line in open(path) if line.strip()]


def cli_generate(lockstep_bin, tmp_path, specs, backend="cpu", *extra):
    """`lockstep generate` over `specs` (with `extra` options): {id: tokens}."""
    prompts = tmp_path / f"prompts-{backend}-{len(specs)}.jsonl"
    prompts.write_text("".join(json.dumps(s) + "\n" for s in specs))
    out = run_cli(lockstep_bin, "generate", "--prompts", prompts, "--backend", backend, "-q", *extra).stdout
    return {line["id"]: line["tokens"] for line in map(json.loads, out.splitlines())}
