#!/usr/bin/python3
"""Packs a Python plugin and this SDK into one executable file.

    /usr/bin/python3 sdk/python/mkplugin.py SOURCE -o bin/plugins/fp-plugin-NAME

SOURCE is the plugin: a .py file (its entry point), or a directory with a
__main__.py and any modules it imports. The output is a Python zip
application starting with `#!/usr/bin/python3` (or -p INTERPRETER): one
regular executable file holding the plugin and the taskhost_plugin
package, which the host discovers, checks, pins with sha256 and runs like
a Go plugin binary. It is written next to its destination and renamed
into place, so a running plugin never sees it change.
"""

import argparse
import os
import shutil
import sys
import tempfile
import zipapp

SDK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "taskhost_plugin")


def _ignore(_, names):
    return [n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo"))]


def build(source, output, interpreter="/usr/bin/python3"):
    with tempfile.TemporaryDirectory() as stage:
        app = os.path.join(stage, "app")
        if os.path.isdir(source):
            if not os.path.exists(os.path.join(source, "__main__.py")):
                raise SystemExit("mkplugin: %s has no __main__.py, the plugin's entry point" % source)
            shutil.copytree(source, app, ignore=_ignore)
        elif os.path.isfile(source):
            os.mkdir(app)
            shutil.copy(source, os.path.join(app, "__main__.py"))
        else:
            raise SystemExit("mkplugin: %s: no such file or directory" % source)
        if os.path.exists(os.path.join(app, "taskhost_plugin")):
            raise SystemExit("mkplugin: %s has its own taskhost_plugin; remove it, the SDK is added here" % source)
        shutil.copytree(SDK, os.path.join(app, "taskhost_plugin"), ignore=_ignore)
        out_dir = os.path.dirname(os.path.abspath(output))
        os.makedirs(out_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".mkplugin-")
        os.close(fd)
        try:
            zipapp.create_archive(app, tmp, interpreter=interpreter)
            os.chmod(tmp, 0o755)
            os.replace(tmp, output)
        except BaseException:
            os.unlink(tmp)
            raise


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="the plugin: a .py file, or a directory with __main__.py")
    ap.add_argument("-o", "--output", required=True, help="the file to write, e.g. bin/plugins/fp-plugin-NAME")
    ap.add_argument("-p", "--python", default="/usr/bin/python3", help="the interpreter of the #! line (default /usr/bin/python3)")
    a = ap.parse_args(argv)
    build(a.source, a.output, a.python)
    print("wrote " + a.output)


if __name__ == "__main__":
    sys.exit(main())
