"""The package's shape: no import circles, a small root, every package saying what it holds."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

import recordforge

ROOT = Path(recordforge.__file__).parent


def test_no_module_imports_one_that_imports_it_back() -> None:
    """Function-level and type-only imports count: a type that needs an import back up is in the
    wrong module. (The layers between packages are import-linter's: `make lint`.)"""
    graph = grimp.build_graph("recordforge", cache_dir=None)
    circles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and graph.chain_exists(importer=imported, imported=module):
                circles.append(f"{module} -> {imported}")
    assert not circles, circles


def test_the_root_holds_the_public_api_and_its_vocabulary_only() -> None:
    modules = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(modules) <= 6, modules


def test_every_package_says_what_it_holds() -> None:
    for init in sorted(ROOT.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 40, f"{init.relative_to(ROOT)}: no docstring saying what the package holds"
