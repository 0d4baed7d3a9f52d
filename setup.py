"""Installs autoclust-hook.pth next to the package (see autoclust/hook.py).

Everything else is in pyproject.toml; this file exists only because a .pth file must sit
at the top of site-packages, which setuptools' declarative config cannot express. A
regular install takes it from build_py's outputs; an editable one (`pip install -e .`,
PEP 660) builds its wheel from a mapping of the packages and leaves other outputs out, so
its wheel gets the file directly (it sorts after setuptools' `__editable__.*.pth`, which
makes `autoclust` importable first).
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HOOK = "autoclust-hook.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithHook(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join(HERE, HOOK), os.path.join(self.build_lib, HOOK))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, HOOK)]


class EditableWheelWithHook(editable_wheel):
    # setuptools >= 64 calls this while the wheel's files are laid out in `unpacked_wheel`
    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
        built = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        shutil.copyfile(os.path.join(HERE, HOOK), os.path.join(unpacked_wheel, HOOK))
        return built


setup(cmdclass={"build_py": BuildPyWithHook, "editable_wheel": EditableWheelWithHook})
