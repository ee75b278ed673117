"""The type stubs (`_native.pyi`) describe the compiled module exactly, and every public
name of it carries a docstring.

Both directions are checked: a name in the stubs that the module lacks is a stub for an API
that does not exist; a public name of the module that the stubs lack is invisible to type
checkers and editors.
"""

import ast
import inspect
from pathlib import Path

import rollout_buffer
from rollout_buffer import _native

STUBS = Path(rollout_buffer.__file__).with_name("_native.pyi")


def _stub_names():
    """Module-level names of the stubs, and per class the methods they declare."""
    tree = ast.parse(STUBS.read_text())
    module, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            module.add(node.name)
            classes[node.name] = {
                item.name
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            module.add(node.target.id)
    return module, classes


def _public(names):
    return {n for n in names if not n.startswith("_")}


def test_stubs_name_exactly_the_modules_public_names():
    module, _ = _stub_names()
    actual = _public(dir(_native)) - {"_native"}
    assert _public(module) == actual


def test_stubs_declare_exactly_each_classes_public_methods():
    _, classes = _stub_names()
    for name, declared in classes.items():
        cls = getattr(_native, name)
        if issubclass(cls, BaseException):
            continue  # exceptions inherit their methods
        actual = {
            n
            for n, v in vars(cls).items()
            if not n.startswith("_") and callable(v)
        }
        assert _public(declared) == actual, name


def test_every_public_class_and_method_has_a_docstring():
    undocumented = []
    for name in _public(dir(_native)):
        obj = getattr(_native, name)
        if not inspect.isclass(obj):
            continue
        if not (obj.__doc__ or "").strip():
            undocumented.append(name)
        if issubclass(obj, BaseException):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_") or not callable(value):
                continue
            if not (getattr(value, "__doc__", None) or "").strip():
                undocumented.append(f"{name}.{attr}")
    assert undocumented == []
