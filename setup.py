"""Installs autoclust-hook.pth next to the package (see autoclust/hook.py).

Everything else is in pyproject.toml; this file exists only because a .pth file must sit
at the top of site-packages, which setuptools' declarative config cannot express.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK = "autoclust-hook.pth"


class BuildPyWithHook(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), HOOK),
                       os.path.join(self.build_lib, HOOK))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, HOOK)]


setup(cmdclass={"build_py": BuildPyWithHook})
