"""Builds recordforge.records._native with ASan and UBSan into a folder of its own (`make sanitize`).

`python fuzz/build_sanitized.py DIR` compiles the extension into DIR and writes DIR/sitecustomize.py,
which makes a Python started with PYTHONPATH=DIR (and libasan in LD_PRELOAD) import that build
instead of the one in src/; the source tree is left as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

SOURCES = ["_native.c", "_examples.c", "_decode.c"]
FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"]
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]

_SITECUSTOMIZE = '''"""Imports recordforge.records._native from the sanitized build beside this file."""
import importlib.machinery
import importlib.util
import sys

_SO = {so!r}


class _Sanitized:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "recordforge.records._native":
            return None
        return importlib.util.spec_from_file_location(
            name, _SO, loader=importlib.machinery.ExtensionFileLoader(name, _SO)
        )


sys.meta_path.insert(0, _Sanitized)
'''


def main(out: str) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = os.path.join(root, "src", "recordforge", "records")
    os.makedirs(out, exist_ok=True)
    so = os.path.abspath(os.path.join(out, "_native" + sysconfig.get_config_var("EXT_SUFFIX")))
    cc = os.environ.get("CC", "gcc")
    cmd = [cc, "-shared", "-fPIC", *FLAGS, *SANITIZERS, "-I", sysconfig.get_paths()["include"]]
    cmd += [os.path.join(src, s) for s in SOURCES] + ["-o", so]
    print(" ".join(cmd), flush=True)
    subprocess.check_call(cmd)
    with open(os.path.join(out, "sitecustomize.py"), "w") as f:
        f.write(_SITECUSTOMIZE.format(so=so))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/sanitize")
