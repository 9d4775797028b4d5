"""A Python plugin that hangs at start and never answers the handshake."""

import time

import taskhost_plugin as th

plugin = th.Plugin("pyhang")
time.sleep(3600)

if __name__ == "__main__":
    plugin.serve()
