"""Stub torchvision for importing timm's ViT Block on a machine without torchvision (no CPU build here): every
`torchvision.*` module exists and every attribute is a dummy class. Only timm's data/ops imports touch it."""
import importlib.abc
import importlib.machinery
import sys
import types


class _Dummy(type):
    """A class whose every class attribute is another dummy (InterpolationMode.NEAREST, ...)."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy(name, (), {})


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Dummy(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        module.__version__ = "0.0"
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
