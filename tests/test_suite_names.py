"""The suite's own import names do not shadow an installed package.

pytest puts `tests/` at the front of `sys.path` (there is no `tests/__init__.py`), so every
module and package directly in it is importable under its bare name. A folder named like a
distribution's module hides that module from every library the tests import: a CI image with
the hub `kernels` package installed failed because transformers imported `tests/kernels`
instead of it.
"""

import importlib.metadata
from pathlib import Path

TESTS = Path(__file__).parent


def top_level_names() -> set[str]:
    names = {path.stem for path in TESTS.glob("*.py")}
    names |= {path.parent.name for path in TESTS.glob("*/__init__.py")}
    return names


def test_no_suite_name_is_an_installed_module():
    installed = importlib.metadata.packages_distributions()
    clashes = {name: installed[name] for name in sorted(top_level_names()) if name in installed}
    assert not clashes, f"rename these test modules, installed packages own the names: {clashes}"


def test_the_suite_name_list_is_read():
    # The check above passes on an empty list too: make sure it saw the suite.
    assert {"conftest", "kernel_tests", "gpu", "test_suite_names"} <= top_level_names()
