"""The README's "From Python" section: every python and sh block runs, in order, in one scratch
directory (`build/` there points at the build under test)."""

import os
import re
import subprocess
import sys

import lockstep
from conftest import SOURCE_DIR


def blocks():
    text = (SOURCE_DIR / "README.md").read_text()
    section = text.split("## From Python", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(python|sh)\n(.*?)```", section, re.S)


def test_readme_from_python_blocks_run(lockstep_bin, tmp_path):
    found = blocks()
    assert [kind for kind, _ in found].count("python") == 3
    os.symlink(lockstep_bin.parent, tmp_path / "build")
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(lockstep.__file__)))
    env = dict(os.environ, PYTHONPATH=package_dir)
    for kind, code in found:
        command = [sys.executable, "-c", code] if kind == "python" else ["bash", "-euc", code]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"README {kind} block failed:\n{code}\n{done.stdout}\n{done.stderr}"
