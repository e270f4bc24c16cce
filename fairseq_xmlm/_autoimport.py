"""Import every module of a sub-package so its fairseq registry decorators run."""
import importlib
import pkgutil


def import_all_modules(package_name, package_path):
    for info in pkgutil.iter_modules(package_path):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package_name}.{info.name}")
