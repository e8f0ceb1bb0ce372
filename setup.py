"""Only a build step pyproject.toml cannot declare: leave the test-only modules out of the wheel.

Whole test-only packages (``vllm_lookahead.devtools``) are excluded in pyproject.toml
([tool.setuptools.packages.find]); setuptools has no exclude for single modules, so ``build_py``
drops these.  An editable install (``pip install -e .``, what scripts/setup.sh makes) maps the whole
source directories, so tests and benchmarks still import them from a checkout.
tests/test_wheel_contents.py checks the built wheel.
"""

from setuptools import setup
from setuptools.command.build_py import build_py

# (package, module): the gate's TEST-ONLY faulty decoders and the patch targets they use.
DEV_ONLY_MODULES = {
    ("vllm_lookahead.gate", "faulty"),
    ("vllm_lookahead.vllm", "fault_patches"),
}


class BuildPyWithoutDevModules(build_py):
    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) not in DEV_ONLY_MODULES]


setup(cmdclass={"build_py": BuildPyWithoutDevModules})
