"""A Python plugin that fails at start, before it serves."""

import taskhost_plugin as th

plugin = th.Plugin("pycrasher")
raise RuntimeError("pycrasher: failing on purpose at start")
